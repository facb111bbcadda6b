"""The goodput ledger added up: per job (`GET /api/v1/jobs/{id}/goodput`) and over a period per
cluster, team, user, node and class (`yard report goodput`, `GET /api/v1/report/goodput`).

An attempt's buckets (services/goodput.py; docs/accounting.md, "Goodput ledger") are:
- an ended attempt's stored ledger (`attempts.ledger`, set by the reconcile step);
- a running attempt's, split live when read: its phase files, telemetry and the stop asked of it
  now (`live` in the job's answer);
- an ended attempt without a stored ledger (one that never launched, or ended before the ledger
  existed): split from its row alone (its first output), no phase file or telemetry read, so that
  a report over a long history of such attempts costs one query.
In a period, an attempt counts with the part of its run inside it: its buckets scaled by that
part (the ledger keeps totals, not when each second went), so a row's buckets add up to its
allocated GPU-seconds in the period, as `yard report` counts them. A node's row takes each
attempt's GPU-seconds in proportion to the GPUs it held there.

Who sees what is `yard report`'s (services/usage_report.py): every role but a job token sees the
cluster, team, node and class rows; users only admins and operators (all) and members (their
team's). A job's own breakdown needs what reading the job needs (`jobs.get`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from pydantic import BaseModel, Field
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from trainyard.contracts import LEDGER_BUCKETS, JobDir
from trainyard.services import goodput, goodput_facts, jobs
from trainyard.services.auth import Principal
from trainyard.services.errors import Forbidden, ServiceError
from trainyard.store.models import AttemptRow, JobRow

if TYPE_CHECKING:  # accounting reads the ledger through this module
    from trainyard.services.accounting import Window

SECTIONS = ("cluster", "team", "user", "node", "class")


class AttemptGoodput(BaseModel):
    attempt: int
    started_at: float
    ended_at: float | None
    gpus: int
    allocated_gpu_s: float
    buckets: dict[str, float] = Field(description="GPU-seconds per bucket (contracts.LEDGER_BUCKETS)")
    live: bool = Field(description="running: split now, from what the attempt has written so far")


class JobGoodput(BaseModel):
    job_id: int
    allocated_gpu_s: float
    buckets: dict[str, float]
    attempts: list[AttemptGoodput]


class GoodputRow(BaseModel):
    key: str = Field(description="the cluster's, team's, 'team/user', node's or class's name")
    allocated_gpu_s: float
    buckets: dict[str, float]
    goodput: float | None = Field(description="compute / allocated (null: nothing allocated)")
    attempts: int


class GoodputReport(BaseModel):
    start: float
    end: float
    now: float
    sections: dict[str, list[GoodputRow]] = Field(description="by cluster, team, user, node, class: as asked")
    users_shown: str = Field(description="'all', a team's name (a member sees their team's users), or 'none'")


def sections_of(text: str | None) -> tuple[str, ...]:
    """`by` (comma-separated; empty: every section); an unknown one is a 400 naming `by`."""
    names = tuple(dict.fromkeys(x.strip() for x in (text or "").split(",") if x.strip())) or SECTIONS
    bad = [x for x in names if x not in SECTIONS]
    if bad:
        raise ServiceError(f"by: {bad[0][:40]!r} is not one of {', '.join(SECTIONS)}", field="by")
    return names


# -- one attempt --------------------------------------------------------------------------------------

def attempt_buckets(s: Session, a: Any, now: float, *, data_dir: Path | None, job: Any, spec: Any) -> dict[str, float]:
    """The whole attempt's buckets (see the module docstring). `a` is an attempt row (or a row of
    its columns), `job` its job's row (or the columns `jobs.job_dir` and the stop need)."""
    if a.ended_at is not None and isinstance(a.ledger, dict):
        return goodput.scaled(a.ledger, 1.0)
    running = a.ended_at is None
    jd = JobDir.of(data_dir, job.id, job.dir_key) if data_dir is not None and running else None
    stop_at = job.stop_since if running and job.stop_kind is not None and job.attempt == a.attempt else None
    return goodput.split(goodput_facts.attempt_facts(
        s, a, now, jd=jd, tasks_per_node=job.tasks_per_node, stop_at=stop_at,
        below=goodput_facts.idle_below(spec, job.job_class), telemetry=running))


def job_goodput(s: Session, data_dir: Path | None, spec: Any, job_id: int, by: Principal, now: float) -> JobGoodput:
    """The job's ledger, attempt by attempt (who may read the job may read it)."""
    j = jobs.get(s, job_id, by)
    rows = s.scalars(select(AttemptRow).where(AttemptRow.job_id == job_id).order_by(AttemptRow.attempt)).all()
    out, total = [], goodput.empty()
    for a in rows:
        b = attempt_buckets(s, a, now, data_dir=data_dir, job=j, spec=spec)
        for k, v in b.items():
            total[k] += v
        out.append(AttemptGoodput(attempt=a.attempt, started_at=a.started_at, ended_at=a.ended_at, gpus=a.gpus,
                                  allocated_gpu_s=math.fsum(b.values()), buckets=b, live=a.ended_at is None))
    return JobGoodput(job_id=job_id, allocated_gpu_s=math.fsum(total.values()), buckets=total, attempts=out)


# -- a period -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Piece:
    """One attempt's part of a period: its buckets scaled to the part of its run inside it."""

    job_id: int
    team: str
    user: str
    pool: str
    job_class: str
    placement: list[dict[str, Any]]
    buckets: dict[str, float]


# what `attempt_buckets` reads of an attempt and of its job (JobRef), as columns
LEDGER_COLUMNS = (AttemptRow.ledger, AttemptRow.first_output_at, JobRow.tasks_per_node, JobRow.dir_key,
                  JobRow.stop_kind, JobRow.stop_since, JobRow.attempt.label("job_attempt"))
_COLUMNS = (AttemptRow.job_id, AttemptRow.attempt, AttemptRow.placement, AttemptRow.started_at, AttemptRow.ended_at,
            AttemptRow.gpus, AttemptRow.lost_gpu_s, JobRow.team, JobRow.user, JobRow.pool, JobRow.job_class,
            *LEDGER_COLUMNS)


@dataclass(frozen=True)
class JobRef:
    """What `attempt_buckets` reads of an attempt's job, from a row of selected columns."""

    id: int
    dir_key: str | None
    stop_kind: str | None
    stop_since: float | None
    attempt: int
    tasks_per_node: int | None
    job_class: str


def job_ref(r: Any) -> JobRef:
    """The job of a row that has `LEDGER_COLUMNS`, `job_id` and `job_class`."""
    return JobRef(r.job_id, r.dir_key, r.stop_kind, r.stop_since, r.job_attempt, r.tasks_per_node, r.job_class)


def in_period(s: Session, a: Any, job: Any, part: float, now: float, *, data_dir: Path | None,
              spec: Any) -> dict[str, float]:
    """The attempt's buckets scaled to `part` seconds of its run (all of it: its whole span)."""
    whole = (now if a.ended_at is None else a.ended_at) - a.started_at
    if whole <= 0 or part <= 0 or not a.gpus:
        return goodput.empty()
    b = attempt_buckets(s, a, now, data_dir=data_dir, job=job, spec=spec)
    f = min(1.0, part / whole)
    return {k: v * f for k, v in b.items()}


def pieces(s: Session, win: Window, now: float, *, data_dir: Path | None, spec: Any,
           running: bool = False) -> Iterator[Piece]:
    """Every attempt that ran during the period (`running`: only those running now), with its buckets in it."""
    a = AttemptRow
    q = (select(*_COLUMNS).join(JobRow, JobRow.id == a.job_id)
         .where(a.started_at < win.end, a.ended_at.is_(None) if running else
                or_(a.ended_at.is_(None), a.ended_at >= win.start))
         .order_by(a.job_id, a.attempt))
    for r in s.execute(q):
        part = max(0.0, min(now if r.ended_at is None else r.ended_at, win.end) - max(r.started_at, win.start))
        if part > 0 and r.gpus:
            b = in_period(s, r, job_ref(r), part, now, data_dir=data_dir, spec=spec)
            yield Piece(r.job_id, r.team, r.user, r.pool, r.job_class, r.placement or [], b)


def _keys(section: str, p: Piece, cluster: str) -> list[tuple[str, float]]:
    """(row key, share of the piece) of a piece in a section."""
    if section == "cluster":
        return [(cluster, 1.0)]
    if section == "team":
        return [(p.team, 1.0)]
    if section == "user":
        return [(f"{p.team}/{p.user}", 1.0)]
    if section == "class":
        return [(p.job_class, 1.0)]
    return node_shares(p)


def node_shares(p: Piece) -> list[tuple[str, float]]:
    """(node, share of the piece) for each node of its placement: its share of the GPUs held."""
    held = [(str(x.get("node")), len(x.get("gpus") or [])) for x in p.placement if isinstance(x, dict)]
    n = sum(g for _, g in held)
    return [(node, g / n) for node, g in held if g] if n else []


def report(s: Session, spec: Any, by: Principal, win: Window, now: float, sections: tuple[str, ...] = SECTIONS, *,
           data_dir: Path | None = None) -> GoodputReport:
    """The ledger per section over the period (see the module docstring)."""
    if by.role == "job":
        raise Forbidden("a job token reads only its own job")
    cluster = getattr(getattr(spec, "cluster", None), "name", "cluster")
    sums: dict[str, dict[str, dict[str, float]]] = {x: defaultdict(goodput.empty) for x in sections}
    counts: dict[str, dict[str, int]] = {x: defaultdict(int) for x in sections}
    shown = "all" if by.role in ("admin", "operator") else (by.team if by.role == "member" and by.team else "none")
    for p in pieces(s, win, now, data_dir=data_dir, spec=spec):
        for sec in sections:
            if sec == "user" and shown != "all" and p.team != shown:
                continue
            for key, share in _keys(sec, p, cluster):
                row = sums[sec][key]
                for b in LEDGER_BUCKETS:
                    row[b] += p.buckets[b] * share
                counts[sec][key] += 1
    out = {sec: [_row(k, v, counts[sec][k]) for k, v in sorted(sums[sec].items())] for sec in sections}
    return GoodputReport(start=win.start, end=win.end, now=now, sections=out, users_shown=shown)


def _row(key: str, buckets: dict[str, float], attempts: int) -> GoodputRow:
    return GoodputRow(key=key, allocated_gpu_s=math.fsum(buckets.values()), buckets=buckets,
                      goodput=goodput.share(buckets), attempts=attempts)
