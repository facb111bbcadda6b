"""Before an attempt's ranks start: its checkpoints under the plane's rules, and a resume across
tiers (issue 41).

When the plane keeps a job's checkpoints (lifecycle rules, or an archive:
`services.checkpoint_copies.plane_rules`), the ranks get `TRAINYARD_CHECKPOINT_RETENTION=plane`,
so the runtime deletes no committed step itself.

A resume finds the newest committed checkpoint in either tier: when the archive holds a step newer
than any committed in the job dir (the fast copies were removed, or lost), the attempt shows
CONFIGURING with reason `CheckpointFetch` while the step is copied back into the job's
`checkpoints/` as the owner's files, through no link (`staging/archive_io.py`: every file's sha256
checked, the marker last); then the ranks start and the runtime loads it as usual. An event says
what was fetched and how long it took. A fetch that fails puts the job back in the queue after a
pause (the archive's fault, not the job's: not counted against its retries), as `start_failure.py`
says for every step before the ranks: the pause grows, and 5 failures in a row fail the job.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from trainyard import jobfs
from trainyard.backends.base import LaunchSpec
from trainyard.contracts import PLANE_RETENTION, JobDir, JobVar
from trainyard.control.loop import start_failure
from trainyard.control.loop.context import LoopContext
from trainyard.jobfs.records import newest_checkpoint
from trainyard.services import checkpoint_copies as copies
from trainyard.services import transitions
from trainyard.services.events import record
from trainyard.services.owners import Identity
from trainyard.staging.archive_io import ArchiveError
from trainyard.states import JobState
from trainyard.store.models import JobRow

log = logging.getLogger("trainyard.loop")

CHECKPOINT_FETCH = "CheckpointFetch"  # the reason a CONFIGURING job shows while a step comes back
FETCH_ERROR = "CheckpointFetchError"
STEP = start_failure.Step(FETCH_ERROR, "checkpoint_fetch", "checkpoint_fetch", "the archive's")


def prepare(ctx: LoopContext, spec: LaunchSpec, who: Identity) -> LaunchSpec | None:
    """The spec to launch (with the retention variable when the plane keeps the checkpoints), its
    newest checkpoint in the job dir; None when the attempt ended here (a fetch failed: recorded)."""
    with ctx.store.session() as s:
        j = s.get(JobRow, spec.job_id)
        if j is None:
            return spec
        spec_cfg = ctx.configs.current(s).spec
        if not copies.plane_rules(spec_cfg, j.team, j.job_class):
            return spec
        newest_archived = copies.newest_archived(s, j.id)
        where = (newest_archived.step, newest_archived.location) if newest_archived is not None else None
    spec = replace(spec, env={**spec.env, JobVar.CHECKPOINT_RETENTION: PLANE_RETENTION})
    if where is None:
        return spec
    jd = JobDir(spec.job_dir)
    tree = jobfs.Tree(jd.root)
    fast = newest_checkpoint(tree, "checkpoints")
    step, location = where
    if fast is not None and fast[0] >= step:
        return spec
    try:
        archive = copies.archive_for(spec_cfg)
    except ArchiveError as e:
        _failed(ctx, spec, step, e)
        return None
    if archive is None:  # no longer configured: the job resumes from what its job dir holds
        return spec
    if not _configuring(ctx, spec, step):
        return None
    began = time.monotonic()
    try:
        n = archive.fetch_step(location, tree, "checkpoints", step, (who.owner.uid, who.group))
    except (ArchiveError, OSError) as e:
        tree.remove_tree(f"checkpoints/step-{step}")
        _failed(ctx, spec, step, e)
        return None
    took = time.monotonic() - began
    now = ctx.clock()
    with ctx.lock, ctx.store.session.begin() as s:
        j = s.get(JobRow, spec.job_id)
        if j is None or j.attempt != spec.attempt:
            return None
        if j.state == JobState.CONFIGURING:
            j.state, j.reason, j.start_time = JobState.RUNNING, "None", now
        row = transitions.attempt_row(s, j)
        if row is not None:
            row.started_at = now
        record(s, "scheduler", "checkpoint.fetched",
               f"attempt {spec.attempt}: step {step} ({n} bytes) fetched back from the archive in {took:.1f}s",
               job_id=j.id, at=now, data={"step": step, "bytes": n, "seconds": round(took, 3), "location": location})
    return spec


def _configuring(ctx: LoopContext, spec: LaunchSpec, step: int) -> bool:
    """RUNNING → CONFIGURING (reason CheckpointFetch) while the step comes back; False when the
    attempt is no longer the job's current one."""
    with ctx.lock, ctx.store.session.begin() as s:
        j = s.get(JobRow, spec.job_id)
        if j is None or j.attempt != spec.attempt or j.state not in (JobState.RUNNING, JobState.CONFIGURING):
            return False
        j.state, j.reason = JobState.CONFIGURING, CHECKPOINT_FETCH
    log.info("job %s attempt %s: fetching checkpoint step %s from the archive", spec.job_id, spec.attempt, step)
    return True


def _failed(ctx: LoopContext, spec: LaunchSpec, step: int, e: Exception) -> None:
    """A fetch that failed is the archive's fault: the one rule of a failed start step
    (`start_failure.py`: back in the queue after a growing pause, failed after 5 in a row)."""
    if _configuring(ctx, spec, step):  # (a configuration error comes before the fetch began)
        start_failure.failed(ctx, spec, STEP, f"step {step}: {e}", "", True, {"step": step})
