"""/api/v1/teams: teams and their quotas (an update writes a new configuration version)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from sqlalchemy.orm import Session

from trainyard.api.deps import plane, principal, reader, session, storable_input
from trainyard.services import teams, units
from trainyard.services.auth import Principal
from trainyard.services.plane_facade import Plane

router = APIRouter(prefix="/api/v1/teams", tags=["teams"], dependencies=[Depends(storable_input)])


@router.get("")
def list_teams(by: Principal = Depends(reader), cp: Plane = Depends(plane),
               s: Session = Depends(session)) -> dict[str, Any]:
    return {"teams": teams.list_teams(s, cp.configs.current(s))}


@router.get("/{name}")
def get_team(name: str, by: Principal = Depends(reader), cp: Plane = Depends(plane),
             s: Session = Depends(session)) -> dict[str, Any]:
    return teams.get_team(s, cp.configs.current(s), name)


@router.put("/{name}")
def update_team(name: str, body: teams.TeamUpdate, by: Principal = Depends(principal),
                cp: Plane = Depends(plane)) -> dict[str, Any]:
    """Replace the quotas of the pools named (their fields not given are removed)."""
    return units.update_team(cp, name, body, by)


@router.patch("/{name}")
def patch_team(name: str, body: teams.TeamPatch, by: Principal = Depends(principal),
               cp: Plane = Depends(plane)) -> dict[str, Any]:
    """Change only the cohort, pools and quota fields named; a field sent as null is removed."""
    return units.update_team(cp, name, body, by)

