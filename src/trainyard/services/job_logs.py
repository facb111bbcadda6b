"""A rank's log for `GET /api/v1/jobs/{id}/logs`: a page of it, or its new bytes as they come.

The job's owner writes the log, so it is read through `jobfs` (design rule 7) and in pages of at
most `jobfs.PAGE_MAX` bytes: a 1 GB log is never read whole. Following is asynchronous so that a
follower holds no worker thread, no store connection and no lock while it waits (twenty
`yard logs -f` used to hold twenty threads asleep, and a pass of the control loop took 29 s);
reads and the store lookup are short hops to a worker thread.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import AsyncIterator

from anyio import to_thread
from sqlalchemy.orm import Session

from trainyard import jobfs
from trainyard.services import jobs
from trainyard.services.auth import Principal
from trainyard.services.errors import ServiceError
from trainyard.services.plane_facade import Plane
from trainyard.services.ranks import ranks_for
from trainyard.states import TERMINAL_STATES
from trainyard.store.models import JobRow

PAGE_MAX = jobfs.PAGE_MAX  # bytes in one response
FOLLOW_POLL_S = 0.25  # how often a follower looks for new bytes
FOLLOW_STATE_EVERY_S = 2.0  # how often it asks the store whether the job has ended (when idle)
FOLLOW_MAX_S = 24 * 3600


def _where(plane: Plane, s: Session, job_id: int, by: Principal, rank: int) -> tuple[JobRow, jobfs.Tree, Path]:
    row = jobs.readable_logs(s, job_id, by)
    jd = jobs.job_dir(plane.data_dir, row)
    return row, jobfs.Tree(jd.root), jd.rank_log(rank)  # the job's owner writes it: `jobfs` reads it


def page(plane: Plane, s: Session, job_id: int, by: Principal, rank: int, offset: int, limit: int) -> jobfs.Chunk:
    """Up to `limit` bytes of rank `rank`'s log from byte `offset` (negative: from the end).

    Raises:
        ServiceError: a rank beyond the job's world, or a log that is not a file the plane reads.
    """
    row, tree, path = _where(plane, s, job_id, by, rank)
    try:
        return tree.read_range(path, offset, limit)
    except FileNotFoundError:
        # A rank of the job's world whose process has not written yet (Slurm creates the file
        # when the task starts, a moment after the job runs) has an empty log; a rank beyond the
        # world is a mistake.
        world = len(ranks_for(row.placement, row.tasks_per_node)) if row.placement else None
        if row.attempt == 0 or (world is not None and rank < world):
            return jobfs.Chunk(b"", 0, 0)
        ranks = f"ranks 0..{world - 1}" if world else "no ranks"
        raise ServiceError(f"job {job_id} has no rank {rank} log (its last attempt had {ranks})", field="rank") from None
    except jobfs.Refused as e:
        raise ServiceError(f"job {job_id}'s rank {rank} log is not a file the plane reads ({e.strerror})",
                           field="rank") from None


def follow(plane: Plane, s: Session, job_id: int, by: Principal, rank: int, offset: int) -> AsyncIterator[bytes]:
    """Rank `rank`'s log from byte `offset` (negative: that many bytes before the end) until the
    job has ended and the log has nothing more. Closes `s` first: the stream may last hours, and
    the store connection goes back now, not at its end."""
    _, tree, path = _where(plane, s, job_id, by, rank)
    s.close()
    if offset < 0:  # the last -offset bytes, then what comes
        st = tree.lstat(path)
        offset = max(0, (st.st_size if st is not None else 0) + offset)
    return _stream(plane, job_id, tree, path, offset)


async def _stream(plane: Plane, job_id: int, tree: jobfs.Tree, path: Path, offset: int) -> AsyncIterator[bytes]:
    pos, idle_after_end, checked = offset, 0, 0.0
    deadline = time.monotonic() + FOLLOW_MAX_S
    while time.monotonic() < deadline and not plane.shutting_down:
        chunk = await to_thread.run_sync(_read_if_there, tree, path, pos, 1 << 20)
        if chunk:
            pos += len(chunk)
            yield chunk
            continue
        if time.monotonic() - checked >= FOLLOW_STATE_EVERY_S or idle_after_end:
            checked = time.monotonic()
            if await to_thread.run_sync(_job_ended, plane, job_id):
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


def _job_ended(plane: Plane, job_id: int) -> bool:
    with plane.store.session() as s:
        row = s.get(JobRow, job_id)
        return row is None or row.state in TERMINAL_STATES
