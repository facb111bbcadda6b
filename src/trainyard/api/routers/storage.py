"""/api/v1/storage: the disk job dirs take, per team, against the quotas and the reserve
(control/lifecycle/storage.py measures; services/storage.py words it)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query
from sqlalchemy.orm import Session

from trainyard.api.deps import plane, reader, session
from trainyard.services.auth import Principal
from trainyard.services.plane_facade import Plane

router = APIRouter(prefix="/api/v1/storage", tags=["storage"])


@router.get("")
def storage(jobs: int = Query(0, ge=0, le=1000, description="also the N biggest job dirs"),
            by: Principal = Depends(reader), cp: Plane = Depends(plane),
            s: Session = Depends(session)) -> dict[str, Any]:
    """Each team's bytes in job dirs (as last measured), its quota and whether it is over; the data
    dir's file system (and that of `jobs/` when it is another) against the reserve."""
    return cp.storage_report(cp.configs.current(s).spec, jobs)
