"""/api/v1/cluster/config: get, apply (a new version), versions, diff, rollback."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Query
from sqlalchemy.orm import Session

from trainyard.api.deps import MAX_ID, plane, principal, reader, session, storable_input
from trainyard.services import config, units
from trainyard.services.auth import Principal
from trainyard.services.plane_facade import Plane

router = APIRouter(prefix="/api/v1/cluster/config", tags=["cluster"], dependencies=[Depends(storable_input)])


@router.get("")
def get_config(version: int | None = Query(None, ge=1, le=MAX_ID), by: Principal = Depends(reader),
               s: Session = Depends(session)) -> dict[str, Any]:
    return units.config_row(config.get_version(s, version))


@router.post("")
def apply_config(text: str = Body(..., embed=True, max_length=1_000_000), message: str = Body("", embed=True, max_length=500),
                 by: Principal = Depends(principal), cp: Plane = Depends(plane)) -> dict[str, Any]:
    """Validate a whole configuration (YAML) and make it the newest version."""
    return units.apply_config(cp, by, text, message)


@router.get("/versions")
def versions(by: Principal = Depends(reader), s: Session = Depends(session)) -> dict[str, Any]:
    return {"versions": config.history(s)}


@router.get("/diff")
def diff(from_version: int = Query(..., alias="from", ge=1, le=MAX_ID),
         to_version: int = Query(..., alias="to", ge=1, le=MAX_ID),
         by: Principal = Depends(reader), s: Session = Depends(session)) -> dict[str, Any]:
    return {"from": from_version, "to": to_version, "diff": config.diff(s, from_version, to_version)}


@router.post("/rollback")
def rollback(version: int = Body(..., embed=True, ge=1, le=MAX_ID), by: Principal = Depends(principal),
             cp: Plane = Depends(plane)) -> dict[str, Any]:
    """Apply an older version's text as the newest version (history is never rewritten)."""
    return units.rollback_config(cp, by, version)
