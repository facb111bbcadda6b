"""/api/v1/jobs/{id}/checkpoints: a job's committed checkpoints in each tier, and keep marks
(issue 41; services/checkpoint_copies.py)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from sqlalchemy.orm import Session

from trainyard.api.deps import JobId, plane, principal, session
from trainyard.services import checkpoint_copies
from trainyard.services import units
from trainyard.services.auth import Principal
from trainyard.services.plane_facade import Plane

router = APIRouter(prefix="/api/v1/jobs", tags=["checkpoints"])
Step = Annotated[int, Path(ge=0, le=2**62, description="a committed step")]


@router.get("/{job_id}/checkpoints")
def listing(job_id: JobId, by: Principal = Depends(principal), s: Session = Depends(session)) -> dict[str, Any]:
    """Each committed step the plane has seen: its tiers, bytes, files, the manifest's metrics, keep."""
    return checkpoint_copies.listing(s, job_id, by)


@router.post("/{job_id}/checkpoints/{step}/keep")
def keep(job_id: JobId, step: Step, undo: bool = Query(False), by: Principal = Depends(principal),
         cp: Plane = Depends(plane)) -> dict[str, Any]:
    """Mark a step keep (it stays fast, no rule deletes it), or remove the mark (`undo`)."""
    return units.checkpoint_keep(cp, job_id, step, by, undo)
