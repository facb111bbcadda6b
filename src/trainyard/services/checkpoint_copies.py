"""The store's side of checkpoint tiers (issue 41): which copies of a job's committed steps exist
(`checkpoint_copies`: tier fast or archive, bytes, files, the manifest's metrics), which steps are
marked keep (`checkpoint_keeps`), and the listing `yard checkpoints JOB` shows.

The plane's thread (control/lifecycle/checkpoint_tiers.py) writes the copies as it sees and moves
them; a member marks steps through the API (`keep`); the pure plan (services/checkpoint_plan.py)
reads both through `checkpoints_of`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.services import datasets, jobs
from trainyard.services.auth import Principal
from trainyard.services.checkpoint_plan import ARCHIVE, FAST, Checkpoint
from trainyard.services.errors import Forbidden, NotFound, ServiceError
from trainyard.services.events import record
from trainyard.spec.models import ConfigSpec
from trainyard.staging.archive_io import Archive, ArchiveError
from trainyard.store.models import CheckpointCopyRow, CheckpointKeepRow, JobRow


def copies(s: Session, job_id: int) -> list[CheckpointCopyRow]:
    """Every recorded copy of the job's steps, by step then tier."""
    return list(s.scalars(select(CheckpointCopyRow).where(CheckpointCopyRow.job_id == job_id)
                          .order_by(CheckpointCopyRow.step, CheckpointCopyRow.tier)))


def keeps(s: Session, job_id: int) -> set[int]:
    return set(s.scalars(select(CheckpointKeepRow.step).where(CheckpointKeepRow.job_id == job_id)))


def checkpoints_of(s: Session, job_id: int) -> list[Checkpoint]:
    """The job's committed steps as the plan sees them: their tiers, metrics and marks."""
    marked = keeps(s, job_id)
    by_step: dict[int, list[CheckpointCopyRow]] = {}
    for row in copies(s, job_id):
        by_step.setdefault(row.step, []).append(row)
    out = []
    for step, rows in sorted(by_step.items()):
        metrics = next((r.metrics for r in rows if r.metrics), None)
        out.append(Checkpoint(step, frozenset(r.tier for r in rows), metrics, step in marked))
    return out


def put(s: Session, job_id: int, step: int, tier: str, *, nbytes: int, files: int, at: float,
        location: str = "", metrics: dict[str, float] | None = None) -> None:
    """Record (or refresh) the copy of `step` in `tier`."""
    assert tier in (FAST, ARCHIVE)
    row = s.get(CheckpointCopyRow, (job_id, step, tier))
    if row is None:
        s.add(CheckpointCopyRow(job_id=job_id, step=step, tier=tier, bytes=nbytes, files=files, at=at,
                                location=location, metrics=metrics or None))
    else:
        row.bytes, row.files, row.at, row.location, row.metrics = nbytes, files, at, location, metrics or None


def drop(s: Session, job_id: int, step: int, tier: str) -> CheckpointCopyRow | None:
    """Forget the copy of `step` in `tier`; the row it was (None: there was none)."""
    row = s.get(CheckpointCopyRow, (job_id, step, tier))
    if row is not None:
        s.delete(row)
    return row


def purged_jobs(s: Session, limit: int = 100) -> list[int]:
    """Jobs with copies on record whose job row is gone (`retention.jobs` purged it): what of them
    the archive still holds is deleted by the tiers thread, their records with it."""
    gone = select(CheckpointCopyRow.job_id).where(~CheckpointCopyRow.job_id.in_(select(JobRow.id)))
    marked = select(CheckpointKeepRow.job_id).where(~CheckpointKeepRow.job_id.in_(select(JobRow.id)))
    return sorted(set(s.scalars(gone.distinct().limit(limit))) | set(s.scalars(marked.distinct().limit(limit))))


def forget_job(s: Session, job_id: int) -> None:
    """Forget every copy and keep mark of a purged job (its archive copies removed first)."""
    for row in copies(s, job_id):
        s.delete(row)
    for mark in s.scalars(select(CheckpointKeepRow).where(CheckpointKeepRow.job_id == job_id)):
        s.delete(mark)


def newest_archived(s: Session, job_id: int) -> CheckpointCopyRow | None:
    """The archive copy of the job's newest archived step."""
    return s.scalars(select(CheckpointCopyRow).where(CheckpointCopyRow.job_id == job_id,
                                                     CheckpointCopyRow.tier == ARCHIVE)
                     .order_by(CheckpointCopyRow.step.desc()).limit(1)).first()


# -- what members see and mark ---------------------------------------------------------------------

def listing(s: Session, job_id: int, by: Principal) -> dict[str, Any]:
    """`GET /api/v1/jobs/{id}/checkpoints`: each committed step the plane has seen, with its tiers
    (and where its archive copy is, to who may manage the job), bytes, files, metrics and mark."""
    j = jobs.get(s, job_id, by)
    manage = by.can_manage_team(j.team)
    marked = keeps(s, job_id)
    steps: dict[int, dict[str, Any]] = {}
    for row in copies(s, job_id):
        e = steps.setdefault(row.step, {"step": row.step, "tiers": [], "bytes": row.bytes, "files": row.files,
                                        "metrics": row.metrics or {}, "keep": row.step in marked})
        e["tiers"].append(row.tier)
        e["metrics"] = e["metrics"] or row.metrics or {}
        if row.tier == ARCHIVE and manage:
            e["archive"] = row.location
    for step in marked - set(steps):  # marked, not (or no longer) seen
        steps[step] = {"step": step, "tiers": [], "bytes": 0, "files": 0, "metrics": {}, "keep": True}
    return {"job_id": job_id, "checkpoints": [steps[k] for k in sorted(steps)]}


def mark_keep(s: Session, job_id: int, step: int, by: Principal, now: float, *, undo: bool = False) -> dict[str, Any]:
    """`yard checkpoints keep JOB STEP [--undo]`: the step stays in the fast tier and no rule
    deletes it (or, undone, the rules apply to it again). Audited.

    Raises:
        NotFound: no such job, or (marking) no committed step `step` that the plane has seen.
        Forbidden: `by` may not manage the job's team.
    """
    _manageable(s, job_id, by)
    row = s.get(CheckpointKeepRow, (job_id, step))
    if undo:
        if row is not None:
            s.delete(row)
            record(s, by.user, "checkpoint.unkept", f"step {step}: keep mark removed by {by.user}",
                   job_id=job_id, at=now, data={"step": step})
        return {"job_id": job_id, "step": step, "keep": False}
    if row is None:
        if s.get(CheckpointCopyRow, (job_id, step, FAST)) is None and \
                s.get(CheckpointCopyRow, (job_id, step, ARCHIVE)) is None:
            raise NotFound(f"job {job_id} has no committed checkpoint step {step} (yard checkpoints {job_id} "
                           "lists them)")
        s.add(CheckpointKeepRow(job_id=job_id, step=step, by=by.user, at=now))
        record(s, by.user, "checkpoint.kept", f"step {step} marked keep by {by.user}", job_id=job_id, at=now,
               data={"step": step})
    return {"job_id": job_id, "step": step, "keep": True}


def _manageable(s: Session, job_id: int, by: Principal) -> JobRow:
    j = jobs.get(s, job_id, by)
    if not by.can_manage_team(j.team):
        raise Forbidden(f"a {by.role} token{' of team ' + by.team if by.team else ''} cannot mark the "
                        f"checkpoints of job {job_id} (team {j.team!r})")
    return j


# -- the configuration's side ----------------------------------------------------------------------

def plane_rules(spec: ConfigSpec, team: str, job_class: str) -> bool:
    """Whether the plane keeps this job's checkpoints (rules configured for it, or an archive):
    then the runtime deletes no committed step itself (`contracts.JobVar.CHECKPOINT_RETENTION`)."""
    if spec.storage.archive is not None:
        return True
    rules = spec.lifecycle_for(team, job_class).checkpoints
    return bool(rules.model_dump(exclude_none=True))


def archive_for(spec: ConfigSpec) -> Archive | None:
    """The configured archive tier, with its object store's settings and credentials (None: none).

    Raises:
        ArchiveError: the store's credentials file cannot be used (naming its field).
    """
    a = spec.storage.archive
    if a is None:
        return None
    if not a.url.startswith("s3://"):
        return Archive(a.url)
    try:
        access = datasets.source_access(spec)
    except ServiceError as e:
        raise ArchiveError(f"storage.archive: {e}") from None
    return Archive(a.url, access.store_for(a.url))
