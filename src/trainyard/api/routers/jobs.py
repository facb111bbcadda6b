"""/api/v1/jobs: submit, read, list with filters, cancel, hold, release, requeue, logs, events."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, AsyncIterator

from fastapi import APIRouter, Depends, Query
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from trainyard import jobfs
from trainyard.api.deps import JobId, plane, principal, session, storable_input
from trainyard.services.ranks import ranks_for
from trainyard.control.lifecycle.plane import ControlPlane
from trainyard.services import events, jobs, progress
from trainyard.services.auth import Principal
from trainyard.services.errors import ServiceError
from trainyard.states import ACTIVE_STATES, PENDING_STATES, TERMINAL_STATES

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"], dependencies=[Depends(storable_input)])


@router.post("", status_code=201)
def submit(body: jobs.JobSubmit, by: Principal = Depends(principal), cp: ControlPlane = Depends(plane)) -> dict[str, Any]:
    with cp.store.session() as s:  # the paths are looked at as the owner, before the plane's lock
        jobs.check_paths(body, by, cp.configs.current(s), cp.data_dir)
    with cp.lock, cp.store.session.begin() as s:
        cfg = cp.configs.current(s)
        row = jobs.submit(s, body, by, cfg, cp.data_dir, now=cp.clock(), paths_checked=True)
        out = jobs.job_dict(row, by)
        if row.mail_type and cfg.spec.notify is None:  # asked for, but nowhere to send it: said, not refused
            out["warnings"] = [f"--mail-type {row.mail_type}: this cluster has no webhook configured (notify: in "
                               "its configuration), so no notification will be sent"]
    if not body.hold:  # a held job is nothing for the scheduler until it is released (which wakes it)
        cp.loop.wake()
    return out


@router.get("")
def list_jobs(state: str | None = Query(None, description="comma-separated states or squeue codes, e.g. "
                                        "PENDING,RUNNING or PD,R; 'all' for every state"),
              team: str | None = None, user: str | None = None, job_class: str | None = Query(None, alias="class"),
              active: bool = Query(False, description="only pending and running jobs (what squeue shows)"),
              limit: int = Query(100_000, ge=1, le=100_000),
              array: int | None = Query(None, ge=1, le=2**62, description="only the tasks of this job array"),
              fields: str | None = Query(None, max_length=1000, description="comma-separated keys to return, "
                                         "e.g. id,state,reason (default: all)"),
              by: Principal = Depends(principal), s: Session = Depends(session)) -> dict[str, Any]:
    states = jobs.parse_states(state)
    keys = [x.strip() for x in fields.split(",") if x.strip()] if fields else None
    if active:
        states = [x for x in (states or PENDING_STATES + ACTIVE_STATES)
                  if x in PENDING_STATES + ACTIVE_STATES] or ["-"]
        if states == ["-"]:
            return {"jobs": []}
    return {"jobs": jobs.list_job_dicts(s, by, states=states, team=team, user=user, job_class=job_class, limit=limit,
                                        fields=keys, array=array)}


@router.get("/{job_id}")
def get_job(job_id: JobId, by: Principal = Depends(principal), cp: ControlPlane = Depends(plane),
            s: Session = Depends(session)) -> dict[str, Any]:
    """The job, its attempts, (to who may manage it, as its workdir) its directory, and the bytes
    its directory held when last measured (`disk`: control/lifecycle/storage.py)."""
    row = jobs.get(s, job_id, by)
    jd = jobs.job_dir(cp.data_dir, row)
    return {**jobs.job_dict(row, by), "attempts": jobs.attempts(s, job_id),
            "job_dir": str(jd.root) if by.can_manage_team(row.team) else None, "disk": cp.storage.job(jd.root.name)}


def _action(fn):  # noqa: ANN001, ANN202
    def handler(job_id: JobId, by: Principal = Depends(principal), cp: ControlPlane = Depends(plane)) -> dict[str, Any]:
        with cp.lock, cp.store.session.begin() as s:
            out = jobs.job_dict(fn(s, job_id, by, now=cp.clock()), by)
        cp.loop.wake()
        return out
    handler.__name__ = fn.__name__
    handler.__doc__ = fn.__doc__
    return handler


for _name, _fn in (("cancel", jobs.cancel), ("hold", jobs.hold), ("release", jobs.release), ("requeue", jobs.requeue)):
    router.add_api_route(f"/{{job_id}}/{_name}", _action(_fn), methods=["POST"], name=f"{_name}_job")


@router.get("/{job_id}/events")
def job_events(job_id: JobId, by: Principal = Depends(principal), s: Session = Depends(session)) -> dict[str, Any]:
    jobs.get(s, job_id, by)
    return {"events": events.list_events(s, job_id=job_id)}


LOG_PAGE_MAX = jobfs.PAGE_MAX  # bytes in one response: a 1 GB log is read in pages, never whole


@router.get("/{job_id}/logs", response_class=PlainTextResponse)
def logs(job_id: JobId, rank: int = Query(0, ge=0, le=1_000_000),
         offset: int = Query(0, ge=-(2**62), le=2**62, description="byte to start from; negative: that many "
                             "bytes before the end (the log's tail)"),
         limit: int = Query(LOG_PAGE_MAX, ge=0, le=LOG_PAGE_MAX, description="bytes at most (a page); the "
                            "X-Log-Next-Offset header says where the next page starts, X-Log-Size how big the "
                            "log is"),
         follow: bool = False, by: Principal = Depends(principal), cp: ControlPlane = Depends(plane),
         s: Session = Depends(session)):  # noqa: ANN201
    """A rank's log (stdout and stderr), a page of at most `limit` bytes from byte `offset`;
    `follow` streams from `offset` until the job ends. Pages end on a whole UTF-8 character."""
    row = jobs.readable_logs(s, job_id, by)
    jd = jobs.job_dir(cp.data_dir, row)
    tree, path = jobfs.Tree(jd.root), jd.rank_log(rank)  # the job's owner writes it: `jobfs` reads it
    if not follow:
        try:
            chunk = tree.read_range(path, offset, limit)
        except FileNotFoundError:
            # A rank of the job's world whose process has not written yet (Slurm creates the
            # file when the task starts, a moment after the job runs) has an empty log; a rank
            # beyond the world is a mistake.
            world = len(ranks_for(row.placement, row.tasks_per_node)) if row.placement else None
            if row.attempt == 0 or (world is not None and rank < world):
                return _page(jobfs.Chunk(b"", 0, 0))
            ranks = f"ranks 0..{world - 1}" if world else "no ranks"
            raise ServiceError(f"job {job_id} has no rank {rank} log (its last attempt had {ranks})", field="rank")
        except jobfs.Refused as e:
            raise ServiceError(f"job {job_id}'s rank {rank} log is not a file the plane reads ({e.strerror})",
                               field="rank") from None
        return _page(chunk)
    s.close()  # the stream may last hours: give the store connection back now, not at its end
    if offset < 0:  # the last -offset bytes, then what comes
        st = tree.lstat(path)
        offset = max(0, (st.st_size if st is not None else 0) + offset)
    return StreamingResponse(_follow(cp, job_id, tree, path, offset), media_type="text/plain")


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


FOLLOW_POLL_S = 0.25  # how often a follower looks for new bytes
FOLLOW_STATE_EVERY_S = 2.0  # how often it asks the store whether the job has ended (when idle)
FOLLOW_MAX_S = 24 * 3600


async def _follow(cp: ControlPlane, job_id: int, tree: jobfs.Tree, path: Path, offset: int) -> AsyncIterator[bytes]:
    """Stream new bytes of a rank's log until the job has ended and the log has nothing more.

    Asynchronous so that a follower holds no worker thread, no store connection and no lock while
    it waits (twenty `yard logs -f` used to hold twenty threads asleep, and a pass of the control
    loop took 29 s); reads and the store lookup are short hops to a worker thread."""
    pos, idle_after_end, checked = offset, 0, 0.0
    deadline = time.monotonic() + FOLLOW_MAX_S
    while time.monotonic() < deadline and not cp.liveness.shutting_down:
        chunk = await run_in_threadpool(_read_if_there, tree, path, pos, 1 << 20)
        if chunk:
            pos += len(chunk)
            yield chunk
            continue
        if time.monotonic() - checked >= FOLLOW_STATE_EVERY_S or idle_after_end:
            checked = time.monotonic()
            if await run_in_threadpool(_job_ended, cp, job_id):
                idle_after_end += 1
                if idle_after_end > 1:  # one more read after the end: the last lines written
                    return
        await asyncio.sleep(FOLLOW_POLL_S)


def _read_if_there(tree: jobfs.Tree, path: Path, offset: int, size: int) -> bytes:
    """Up to `size` bytes from `offset`; none while the log is missing or not a file we read."""
    try:
        return tree.read_range(path, offset, size).data
    except OSError:
        return b""


def _job_ended(cp: ControlPlane, job_id: int) -> bool:
    with cp.store.session() as s:
        row = s.get(jobs.JobRow, job_id)
        return row is None or row.state in TERMINAL_STATES


@router.post("/{job_id}/progress")
def report_progress(job_id: JobId, body: progress.ProgressReport, by: Principal = Depends(principal),
                    cp: ControlPlane = Depends(plane)) -> dict[str, Any]:
    """The in-job runtime's report: step, newest checkpoint, metrics (its TRAINYARD_TOKEN)."""
    with cp.lock, cp.store.session.begin() as s:
        return progress.report(s, job_id, body, by)
