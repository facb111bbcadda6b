"""Retention: finished jobs are kept for the configured time (`retention:` in the cluster config,
`spec.models.RetentionSpec`), then purged in bounded batches (the control plane's retention thread,
control/lifecycle/retention.py, runs them without holding the write lock for long).

Two horizons, both off by default (kept for ever, as slurmdbd's PurgeJobAfter):
- `job_dirs`: a finished job's directory (logs, checkpoints, metrics) is removed; its rows stay,
  so `yard acct` and `yard report` still account for it (everything they read is in the rows);
- `jobs`: a finished job's rows go (the job, its attempts, its events, its estimated starts and their outcomes) — but not its audit events
  (services/audit.py: who cancelled it, held it…), which outlive it. Its directory goes too.

A purge never lowers a Prometheus counter or histogram: what the purged rows added to them
(`metrics.counted` of the batch's jobs) is added to `usage_carry` in the same transaction, and
the scrape adds it back. Each batch records a `retention.purged` event (kept: it is audited).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import CursorResult, Delete, delete, select
from sqlalchemy.orm import Session

from trainyard import jobfs
from trainyard.contracts import JobDir
from trainyard.services import estimates
from trainyard.services.audit import AUDIT_KINDS
from trainyard.services.events import record
from trainyard.services.metrics import carry_key, counted
from trainyard.spec.models import RetentionSpec
from trainyard.states import TERMINAL_STATES
from trainyard.store.models import AttemptRow, EventRow, JobRow, UsageCarryRow


@dataclass
class Purged:
    """One batch's work; `dirs` are removed by the caller once the batch is committed."""

    jobs: int = 0
    attempts: int = 0
    events: int = 0
    dirs: list[Path] = field(default_factory=list)
    last_id: int = 0  # the highest job id looked at (the next batch's cursor for directories)


def _deleted(s: Session, stmt: Delete) -> int:
    """Run a DELETE; the rows it removed. (`Session.execute` is typed as returning a Result: a
    DELETE's is a CursorResult, which counts them.)"""
    result = s.execute(stmt)
    assert isinstance(result, CursorResult)
    return result.rowcount


def purge_jobs(s: Session, data_dir: Path, spec: RetentionSpec, now: float) -> Purged:
    """Delete up to a batch of jobs that ended before the `jobs` horizon, with their attempts and
    non-audit events; carry their counter samples. Call inside a transaction, under the write lock."""
    out = Purged()
    if spec.jobs is None:
        return out
    rows = s.execute(select(JobRow.id, JobRow.dir_key)
                     .where(JobRow.state.in_(TERMINAL_STATES), JobRow.end_time < now - spec.jobs)
                     .order_by(JobRow.id).limit(spec.batch)).all()
    if not rows:
        return out
    ids = [r.id for r in rows]
    for (name, labels), value in counted(s, now, ids).items():
        if not value:
            continue
        key = carry_key(labels)
        row = s.get(UsageCarryRow, (name, key))
        if row is None:
            s.add(UsageCarryRow(name=name, labels=key, value=value))
        else:
            row.value += value
    s.flush()
    estimates.purge(s, ids)  # its estimated starts and their outcomes (counted above)
    out.attempts = _deleted(s, delete(AttemptRow).where(AttemptRow.job_id.in_(ids)))
    out.events = _deleted(s, delete(EventRow).where(EventRow.job_id.in_(ids), EventRow.kind.not_in(AUDIT_KINDS)))
    out.jobs = _deleted(s, delete(JobRow).where(JobRow.id.in_(ids)))
    out.dirs = _existing(data_dir, rows)
    out.last_id = ids[-1]
    record(s, "retention", "retention.purged",
           f"purged {out.jobs} jobs ended before {spec.jobs:.0f} s ago (ids {ids[0]}..{ids[-1]}), with {out.attempts} "
           f"attempts and {out.events} events; their audit events are kept", at=now,
           data={"jobs": out.jobs, "attempts": out.attempts, "events": out.events, "first_id": ids[0],
                 "last_id": ids[-1], "keep_s": spec.jobs, "before": {"jobs": out.jobs}, "after": {"jobs": 0}})
    return out


def dirs_to_purge(s: Session, data_dir: Path, spec: RetentionSpec, now: float, after_id: int) -> Purged:
    """The directories of up to a batch of jobs (ids above `after_id`) that ended before the
    `job_dirs` horizon and still have one; their rows stay. Reads only."""
    out = Purged(last_id=after_id)
    if spec.job_dirs is None:
        return out
    rows = s.execute(select(JobRow.id, JobRow.dir_key)
                     .where(JobRow.id > after_id, JobRow.state.in_(TERMINAL_STATES),
                            JobRow.end_time < now - spec.job_dirs)
                     .order_by(JobRow.id).limit(spec.batch)).all()
    out.dirs = _existing(data_dir, rows)
    out.last_id = rows[-1].id if rows else after_id
    out.jobs = len(rows)  # looked at
    return out


def _existing(data_dir: Path, rows: Any) -> list[Path]:
    """The job dirs of `rows` (id, dir_key) that are there (looked at through no link)."""
    jobs = jobfs.Tree(Path(data_dir) / "jobs")
    dirs = [JobDir.of(data_dir, r.id, r.dir_key).root for r in rows]
    return [d for d in dirs if jobs.exists(d.name)]


def remove(dirs: list[Path]) -> int:
    """Remove job directories (after the batch that named them committed); returns how many went.
    What a job left inside (links, FIFOs, its own trees) is unlinked, never followed (`jobfs`)."""
    n = 0
    for d in dirs:
        n += jobfs.Tree(d.parent).remove_tree(d.name)
    return n
