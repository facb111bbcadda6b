"""/api/v1/jobs: submit, read, list with filters, cancel, hold, release, requeue, logs, events."""

from __future__ import annotations

from typing import Any, Callable

from fastapi import APIRouter, Depends
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from sqlalchemy.orm import Session

from trainyard import jobfs
from trainyard.api.deps import JobId, plane, principal, session, storable_input
from trainyard.api.queries import JobsQuery, LogQuery
from trainyard.services import allocations, events, job_logs, jobs, progress, telemetry, units
from trainyard.services.auth import Principal
from trainyard.services.plane_facade import Plane

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"], dependencies=[Depends(storable_input)])


@router.post("", status_code=201)
def submit(body: jobs.JobSubmit, by: Principal = Depends(principal), cp: Plane = Depends(plane)) -> dict[str, Any]:
    return units.submit_job(cp, by, body)


@router.get("")
def list_jobs(q: JobsQuery = Depends(), by: Principal = Depends(principal),
              s: Session = Depends(session)) -> dict[str, Any]:
    return units.job_listing(s, by, state=q.state, active=q.active, team=q.team, user=q.user, job_class=q.job_class,
                             limit=q.limit, array=q.array, fields=q.fields)


@router.get("/{job_id}")
def get_job(job_id: JobId, by: Principal = Depends(principal), cp: Plane = Depends(plane),
            s: Session = Depends(session)) -> dict[str, Any]:
    """The job, its attempts, (to who may manage it, as its workdir) its directory, and the bytes
    its directory held when last measured (`disk`: control/lifecycle/storage.py)."""
    return units.job_view(cp, s, job_id, by)


def _action(fn: Callable[..., Any]) -> Callable[..., dict[str, Any]]:
    """A route for `jobs.cancel`, `hold`, `release` or `requeue`, named and documented as it is."""
    def handler(job_id: JobId, by: Principal = Depends(principal), cp: Plane = Depends(plane)) -> dict[str, Any]:
        return units.job_action(cp, fn, job_id, by)
    handler.__name__ = fn.__name__
    handler.__doc__ = fn.__doc__
    return handler


for _name, _fn in (("cancel", jobs.cancel), ("hold", jobs.hold), ("requeue", jobs.requeue)):
    router.add_api_route(f"/{{job_id}}/{_name}", _action(_fn), methods=["POST"], name=f"{_name}_job")


@router.post("/{job_id}/release", name="release_job")
def release(job_id: JobId, by: Principal = Depends(principal), cp: Plane = Depends(plane)) -> dict[str, Any]:
    """A held job's hold released (scontrol's); an interactive allocation that is not held ended
    normally (salloc's relinquish: services/allocations.py)."""
    return allocations.release(cp, job_id, by)


@router.get("/{job_id}/events")
def job_events(job_id: JobId, by: Principal = Depends(principal), s: Session = Depends(session)) -> dict[str, Any]:
    jobs.get(s, job_id, by)
    return {"events": events.list_events(s, job_id=job_id)}


@router.get("/{job_id}/gpus")
def job_gpus(job_id: JobId, by: Principal = Depends(principal), s: Session = Depends(session)) -> dict[str, Any]:
    """Per-GPU telemetry: one series per attempt and GPU (`fields` names each point's values) and
    each attempt's summary (docs/control-plane.md, "GPU telemetry")."""
    jobs.get(s, job_id, by)
    return telemetry.series(s, job_id)


@router.get("/{job_id}/logs", response_class=PlainTextResponse)
def logs(job_id: JobId, q: LogQuery = Depends(), by: Principal = Depends(principal), cp: Plane = Depends(plane),
         s: Session = Depends(session)) -> Response:
    """A rank's log (stdout and stderr), a page of at most `limit` bytes from byte `offset`;
    `follow` streams from `offset` until the job ends. Pages end on a whole UTF-8 character."""
    if q.follow:
        return StreamingResponse(job_logs.follow(cp, s, job_id, by, q.rank, q.offset), media_type="text/plain")
    return _page(job_logs.page(cp, s, job_id, by, q.rank, q.offset, q.limit))


def _page(chunk: jobfs.Chunk) -> Response:
    """A page of a log, cut back to the last whole UTF-8 character unless it reaches the end (the
    next page starts with the rest), with where it starts, where the next one does, and the size."""
    data = chunk.data
    if chunk.end < chunk.size:
        data = data[:len(data) - _partial_utf8(data)]
    headers = {"X-Log-Offset": str(chunk.offset), "X-Log-Next-Offset": str(chunk.offset + len(data)),
               "X-Log-Size": str(chunk.size)}
    return Response(data, media_type="text/plain; charset=utf-8", headers=headers)


def _partial_utf8(data: bytes) -> int:
    """How many bytes at the end of `data` begin a UTF-8 character that is not complete (0-3)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 != 0x80:  # the first byte of the last character
            need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
            return back if need > back else 0
    return 0


@router.post("/{job_id}/progress")
def report_progress(job_id: JobId, body: progress.ProgressReport, by: Principal = Depends(principal),
                    cp: Plane = Depends(plane)) -> dict[str, Any]:
    """The in-job runtime's report: step, newest checkpoint, metrics (its TRAINYARD_TOKEN)."""
    return units.report_progress(cp, job_id, body, by)
