"""/api/v1/storage: the disk each team takes, per tier (fast: job dirs, against the quotas and the
reserve; archive; the datasets cache) and kind, and what the lifecycle rules delete next
(control/lifecycle/storage.py measures; services/storage.py and services/storage_view.py word it)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query
from sqlalchemy.orm import Session

from trainyard.api.deps import plane, principal, reader, session
from trainyard.services import storage_view
from trainyard.services.auth import Principal
from trainyard.services.plane_facade import Plane

router = APIRouter(prefix="/api/v1/storage", tags=["storage"])
JOBS = Query(0, ge=0, le=1000, description="also the N biggest job dirs")
NEXT = Query(20, ge=0, le=1000, description="the N soonest deletions of the lifecycle rules")


@router.get("")
def storage(jobs: int = JOBS, next: int = NEXT, by: Principal = Depends(reader), cp: Plane = Depends(plane),
            s: Session = Depends(session)) -> dict[str, Any]:
    """Each team's bytes in job dirs (as last measured), its quota and whether it is over, its
    tiers and kinds; the file systems against the reserve; what the rules delete next."""
    return storage_view.report(cp, s, by, jobs, next)


@router.post("/refresh")
def refresh(jobs: int = JOBS, next: int = NEXT, by: Principal = Depends(principal), cp: Plane = Depends(plane),
            s: Session = Depends(session)) -> dict[str, Any]:
    """An admin's: measure every job dir now, whole, then answer as GET does."""
    return storage_view.report(cp, s, by, jobs, next, refresh=True)
