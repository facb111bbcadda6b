"""/api/v1/teams: teams and their quotas (an update writes a new configuration version)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from sqlalchemy.orm import Session

from trainyard.api.deps import plane, principal, reader, session, storable_input
from trainyard.control.lifecycle.plane import ControlPlane
from trainyard.services import teams
from trainyard.services.auth import Principal

router = APIRouter(prefix="/api/v1/teams", tags=["teams"], dependencies=[Depends(storable_input)])


@router.get("")
def list_teams(by: Principal = Depends(reader), cp: ControlPlane = Depends(plane),
               s: Session = Depends(session)) -> dict[str, Any]:
    return {"teams": teams.list_teams(s, cp.configs.current(s))}


@router.get("/{name}")
def get_team(name: str, by: Principal = Depends(reader), cp: ControlPlane = Depends(plane),
             s: Session = Depends(session)) -> dict[str, Any]:
    return teams.get_team(s, cp.configs.current(s), name)


@router.put("/{name}")
def update_team(name: str, body: teams.TeamUpdate, by: Principal = Depends(principal),
                cp: ControlPlane = Depends(plane)) -> dict[str, Any]:
    """Replace the quotas of the pools named (their fields not given are removed)."""
    return _update(cp, name, body, by)


@router.patch("/{name}")
def patch_team(name: str, body: teams.TeamPatch, by: Principal = Depends(principal),
               cp: ControlPlane = Depends(plane)) -> dict[str, Any]:
    """Change only the cohort, pools and quota fields named; a field sent as null is removed."""
    return _update(cp, name, body, by)


def _update(cp: ControlPlane, name: str, body: teams.TeamUpdate | teams.TeamPatch, by: Principal) -> dict[str, Any]:
    with cp.lock, cp.store.session.begin() as s:
        version = teams.update_team(s, cp.configs.current(s), name, body, by)
    cp.loop.wake()
    with cp.store.session() as s:
        cfg = cp.configs.current(s)
        return {**teams.get_team(s, cfg, name), "config_version": version, "warnings": teams.overcommitted(cfg.spec)}
