"""Retention: finished jobs are kept for the configured time (`retention:` in the cluster config,
`spec.models.RetentionSpec`), then purged in bounded batches (the control plane's retention thread,
control/lifecycle/retention.py, runs them without holding the write lock for long).

Two horizons, both off by default (kept for ever, as slurmdbd's PurgeJobAfter):
- `job_dirs`: a finished job's directory (logs, checkpoints, metrics) is removed; its rows stay,
  so `yard acct` and `yard report` still account for it (everything they read is in the rows);
- `jobs`: a finished job's rows go (the job, its attempts, its events, its estimated starts and their outcomes) — but not its audit events
  (services/audit.py: who cancelled it, held it…), which outlive it. Its directory goes too.

Lifecycle rules (issue 41, spec/lifecycle.py) per team and class, field by field the team's, else
the class's, else the cluster's `storage.lifecycle` (`ConfigSpec.lifecycle_for`):
- `logs`: a finished job's `logs/` is deleted this long after its end;
- `job_dirs`: its whole directory; `retention.job_dirs` is the cluster-wide fallback it always was.
Each deletion is one audit event `retention.deleted` naming the job, what (`logs` or `job_dir`),
its apparent bytes and the rule (`rule_for`'s path, e.g. `teams.nlp.storage.lifecycle.logs`),
recorded in the transaction that, under the write lock, looks at the job's state once more and
moves what goes aside (a rename to `jobs/.retention-…`): no attempt can start between the look and
the move, and no deletion is unrecorded. The removal of what was moved runs after, without the
lock (a crash leaves it for the next pass's `empty_trash`). Only a job in a terminal state is
touched; its rows stay (`yard acct` still counts it).
A purge of `jobs` records the same event for each job dir it removes (rule `retention.jobs`),
beside the batch's `retention.purged`. The checkpoints' rules are applied by
control/lifecycle/checkpoint_tiers.py.

A purge never lowers a Prometheus counter or histogram: what the purged rows added to them
(`metrics.counted` of the batch's jobs) is added to `usage_carry` in the same transaction, and
the scrape adds it back. Each batch records a `retention.purged` event (kept: it is audited).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import CursorResult, Delete, delete, func, not_, select
from sqlalchemy.orm import Session

from trainyard import jobfs
from trainyard.contracts import JobDir
from trainyard.services import estimates
from trainyard.services.audit import AUDIT_KINDS
from trainyard.services.events import record
from trainyard.services.metrics import carry_key, counted
from trainyard.spec.lifecycle import LifecycleSpec
from trainyard.spec.models import ConfigSpec, RetentionSpec
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


def _purge_query(spec: RetentionSpec, now: float) -> Any:
    assert spec.jobs is not None
    return (select(JobRow.id, JobRow.dir_key, JobRow.team)
            .where(JobRow.state.in_(TERMINAL_STATES), JobRow.end_time < now - spec.jobs)
            .order_by(JobRow.id).limit(spec.batch))


def purge_candidates(s: Session, data_dir: Path, spec: RetentionSpec, now: float) -> dict[int, str]:
    """The next batch `purge_jobs` would purge: job id -> its dir's name under `jobs/`, for those
    whose dir is there (so that the caller measures them before the batch, without the lock)."""
    if spec.jobs is None:
        return {}
    rows = s.execute(_purge_query(spec, now)).all()
    jobs = jobfs.Tree(Path(data_dir) / "jobs")
    names = {r.id: JobDir.name_of(r.id, r.dir_key) for r in rows}
    return {jid: name for jid, name in names.items() if jobs.exists(name)}


def purge_jobs(s: Session, data_dir: Path, spec: RetentionSpec, now: float,
               sizes: dict[int, tuple[int, bool]] | None = None) -> Purged:
    """Delete up to a batch of jobs that ended before the `jobs` horizon, with their attempts and
    non-audit events; carry their counter samples. Each job dir that goes is moved aside and
    recorded as one `retention.deleted` event (`sizes`: job id -> (apparent bytes, counted whole),
    as `purge_candidates` and `apparent_bytes` found them). Call inside a transaction, under the
    write lock; `out.dirs` are removed by the caller once it committed."""
    out = Purged()
    if spec.jobs is None:
        return out
    rows = s.execute(_purge_query(spec, now)).all()
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
    rule = Rule(JOB_DIR, spec.jobs, "retention.jobs")
    jobs = jobfs.Tree(Path(data_dir) / "jobs")
    for r in rows:
        name = JobDir.name_of(r.id, r.dir_key)
        if not jobs.exists(name):
            continue
        nbytes, complete = (sizes or {}).get(r.id, (0, False))
        trash = _move_aside(s, data_dir, Due(r.id, r.team, name, rule, now), nbytes, complete, now)
        if trash is not None:
            out.dirs.append(Path(data_dir) / "jobs" / trash)
    out.last_id = ids[-1]
    record(s, "retention", "retention.purged",
           f"purged {out.jobs} jobs ended before {spec.jobs:.0f} s ago (ids {ids[0]}..{ids[-1]}), with {out.attempts} "
           f"attempts and {out.events} events; their audit events are kept", at=now,
           data={"jobs": out.jobs, "attempts": out.attempts, "events": out.events, "first_id": ids[0],
                 "last_id": ids[-1], "keep_s": spec.jobs, "before": {"jobs": out.jobs}, "after": {"jobs": 0}})
    return out


def remove(dirs: list[Path]) -> int:
    """Remove job directories (after the batch that named them committed); returns how many went.
    What a job left inside (links, FIFOs, its own trees) is unlinked, never followed (`jobfs`)."""
    n = 0
    for d in dirs:
        n += jobfs.Tree(d.parent).remove_tree(d.name)
    return n


DELETED = "retention.deleted"  # one per deletion of a rule (an audit kind, services/audit.py)
LOGS, JOB_DIR = "logs", "job_dir"
TRASH = ".retention-"  # what a deletion moved aside under `jobs/`, until it is removed (no job dir's name)


@dataclass(frozen=True)
class Rule:
    """How long a finished job's `what` is kept, and the configuration field that says so."""

    what: str  # LOGS | JOB_DIR
    keep_s: float
    source: str  # e.g. "teams.nlp.storage.lifecycle.logs", "classes.dev.lifecycle.job_dirs", "retention.job_dirs"


def rules_for(spec: ConfigSpec, team: str, job_class: str) -> dict[str, Rule]:
    """The rules for a finished job of `team` and `job_class`: what -> Rule (absent: kept for ever)."""
    t = next((x for x in spec.teams if x.name == team), None)
    c = next((x for x in spec.classes if x.name == job_class), None)
    layers: list[tuple[LifecycleSpec | None, str]] = [
        (t.storage.lifecycle if t else None, f"teams.{team}.storage.lifecycle"),
        (c.lifecycle if c else None, f"classes.{job_class}.lifecycle"), (spec.storage.lifecycle, "storage.lifecycle")]
    out: dict[str, Rule] = {}
    for what, field_ in ((LOGS, "logs"), (JOB_DIR, "job_dirs")):
        for layer, where in layers:
            v = getattr(layer, field_) if layer is not None else None
            if v is not None:
                out[what] = Rule(what, v, f"{where}.{field_}")
                break
    if JOB_DIR not in out and spec.retention.job_dirs is not None:
        out[JOB_DIR] = Rule(JOB_DIR, spec.retention.job_dirs, "retention.job_dirs")
    return out


def horizons(spec: ConfigSpec) -> tuple[float, float] | None:
    """(the shortest, the longest) time any rule keeps logs or dirs; None: no rule at all."""
    layers = [spec.storage.lifecycle, *(t.storage.lifecycle for t in spec.teams), *(c.lifecycle for c in spec.classes)]
    vals = [v for layer in layers if layer is not None for v in (layer.logs, layer.job_dirs) if v is not None]
    if spec.retention.job_dirs is not None:
        vals.append(spec.retention.job_dirs)
    return (min(vals), max(vals)) if vals else None


@dataclass(frozen=True)
class Due:
    """Something of a finished job a rule deletes now: `path` is under `jobs/` (its dir, or its logs)."""

    job_id: int
    team: str
    path: str
    rule: Rule
    due_at: float


def due(s: Session, data_dir: Path, spec: ConfigSpec, now: float, after_id: int, batch: int) -> tuple[list[Due], int]:
    """What the rules delete now of up to `batch` finished jobs with ids above `after_id` (what is
    still there, looked at through no link); and the last id looked at. Reads only."""
    h = horizons(spec)
    if h is None:
        return [], after_id
    rows = s.execute(select(JobRow.id, JobRow.dir_key, JobRow.team, JobRow.job_class, JobRow.end_time)
                     .where(JobRow.id > after_id, JobRow.state.in_(TERMINAL_STATES), JobRow.end_time < now - h[0])
                     .order_by(JobRow.id).limit(batch)).all()
    jobs = jobfs.Tree(Path(data_dir) / "jobs")
    out: list[Due] = []
    rules_of: dict[tuple[str, str], dict[str, Rule]] = {}
    for r in rows:
        if (r.team, r.job_class) not in rules_of:
            rules_of[r.team, r.job_class] = rules_for(spec, r.team, r.job_class)
        rules = rules_of[r.team, r.job_class]
        name = JobDir.name_of(r.id, r.dir_key)
        for what, path in ((JOB_DIR, name), (LOGS, f"{name}/logs")):
            rule = rules.get(what)
            if rule is not None and r.end_time + rule.keep_s <= now and jobs.exists(path):
                out.append(Due(r.id, r.team, path, rule, r.end_time + rule.keep_s))
                break  # the whole dir takes its logs with it
    return out, rows[-1].id if rows else after_id


def undecided_from(s: Session, spec: ConfigSpec, now: float) -> int | None:
    """The lowest job id whose fate under the rules is not settled yet (it runs, or ended within
    the longest horizon): a pass's cursor never goes past it. None: every job is settled."""
    h = horizons(spec)
    if h is None:
        return None
    settled = JobRow.state.in_(TERMINAL_STATES) & (JobRow.end_time < now - h[1])
    low: int | None = s.scalar(select(func.min(JobRow.id)).where(not_(settled)))
    return low


def record_deletion(s: Session, data_dir: Path, d: Due, nbytes: int, complete: bool, now: float) -> str | None:
    """The audit event of one deletion, and what it deletes moved aside (renamed to a trash name
    under `jobs/`, which the caller removes once the transaction committed), if its job is still
    finished: looked at again in the caller's transaction under the write lock, so no attempt can
    start on it between the look and the move. None: leave it (it runs again, or is gone)."""
    state = s.scalar(select(JobRow.state).where(JobRow.id == d.job_id))
    if state not in TERMINAL_STATES:
        return None
    return _move_aside(s, data_dir, d, nbytes, complete, now)


def _move_aside(s: Session, data_dir: Path, d: Due, nbytes: int, complete: bool, now: float) -> str | None:
    trash = TRASH + d.path.replace("/", "-")
    try:
        jobfs.Tree(Path(data_dir) / "jobs").rename(d.path, trash)
    except FileNotFoundError:
        return None
    what = "its logs" if d.rule.what == LOGS else "its job dir"
    record(s, "retention", DELETED, f"deleted {what} ({nbytes} bytes{'' if complete else ' at least'}): "
           f"{d.rule.source} keeps it {d.rule.keep_s:.0f} s after the job ended", job_id=d.job_id, at=now,
           data={"job_id": d.job_id, "team": d.team, "what": d.rule.what, "bytes": nbytes, "complete": complete,
                 "rule": d.rule.source, "keep_s": d.rule.keep_s, "due_at": d.due_at, "path": d.path})
    return trash


def empty_trash(data_dir: Path, names: list[str] | None = None) -> int:
    """Remove what deletions moved aside (`names`, else every trash name under `jobs/`: what a
    crash left between a recorded deletion and its removal); how many went."""
    jobs = jobfs.Tree(Path(data_dir) / "jobs")
    if names is None:
        try:
            names = [n for n, _ in jobs.list_dir("", limit=1_000_000) if n.startswith(TRASH)]
        except OSError:
            return 0  # no jobs/ yet
    return sum(jobs.remove_tree(n) for n in names)


def apparent_bytes(data_dir: Path, path: str, budget_s: float = 30.0) -> tuple[int, bool]:
    """(apparent bytes of `path` under `jobs/`, as `du -sbx` counts them; whether counted whole)."""
    walk = jobfs.UsageWalk(jobfs.Tree(Path(data_dir) / "jobs"), path)
    done = walk.run(deadline=time.monotonic() + budget_s)
    return walk.apparent, done and walk.whole


