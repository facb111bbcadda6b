"""/api/v1/cluster/pilot: the pilot pool's trial (services/pilot.py): start one from a whole
configuration, its status (the pilot against the rest), promote, roll back. Each write a
configuration version, by an admin."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends
from sqlalchemy.orm import Session

from trainyard.api.deps import plane, principal, reader, session, storable_input
from trainyard.services import pilot_status, units
from trainyard.services.auth import Principal
from trainyard.services.plane_facade import Plane

router = APIRouter(prefix="/api/v1/cluster/pilot", tags=["cluster"], dependencies=[Depends(storable_input)])


@router.post("")
def apply_trial(text: str = Body(..., embed=True, max_length=1_000_000), message: str = Body("", embed=True, max_length=500),
                by: Principal = Depends(principal), cp: Plane = Depends(plane)) -> dict[str, Any]:
    """Validate a whole configuration (as `POST /api/v1/cluster/config` does) and try its health
    and node-feature changes on the pilot's nodes only: a new version."""
    return units.pilot_step(cp, by, "apply", message, text)


@router.get("/status")
def status(by: Principal = Depends(reader), cp: Plane = Depends(plane), s: Session = Depends(session)) -> dict[str, Any]:
    """The trial in progress and, since it began, the pilot's figures beside the rest's."""
    return pilot_status.status(s, cp.configs.current(s), cp.clock(), cp.data_dir)


@router.post("/promote")
def promote(message: str = Body("", embed=True, max_length=500), by: Principal = Depends(principal),
            cp: Plane = Depends(plane)) -> dict[str, Any]:
    """The trial's values on every node, the trial ended: a new version."""
    return units.pilot_step(cp, by, "promote", message)


@router.post("/rollback")
def rollback(message: str = Body("", embed=True, max_length=500), by: Principal = Depends(principal),
             cp: Plane = Depends(plane)) -> dict[str, Any]:
    """The trial ended, every node on the configuration's own settings: a new version."""
    return units.pilot_step(cp, by, "rollback", message)
