"""Start-time estimates as promises (issue 40): each waiting job's estimated start is recorded when it
changes, and when the job starts, how far off it was.

Choices, as docs/scheduler.md says them:
- **Which estimate is judged**: the first one a wait was given (`error_s`): what the user saw when
  the job was submitted or requeued, and what they planned by. The last one before the start is
  kept and reported beside it (`last_error_s`): how good the estimate was at its best.
- **A requeued job** makes a new promise: each pending spell (a wait for attempt N, `attempt` = N) is
  recorded and judged on its own; the wait before the first attempt and the wait after a
  preemption are different questions.
- **Only on change**: the schedule step writes a row when the estimate moved by at least
  `MIN_CHANGE_S` from the last one recorded (or appeared: `Recorder`); an estimate that went away (None: held, beyond the estimated
  jobs) writes nothing. A spell keeps its first row and the last `KEPT` - 1: an estimate that moves
  every pass (a job behind one that overran its limit) cannot grow the table without bound.
- **The error** is actual start − estimate: positive when late. A job that started within
  `sim.result.LATE_AFTER_S` of its estimate kept the promise (the loop's passes are seconds apart).
- A job that never had an estimate (it started at once, or waited beyond `max_estimates`) has
  no outcome: it was promised nothing.
Retention deletes both tables' rows with their job (services/retention.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from trainyard.store.models import EstimateOutcomeRow, JobRow, StartEstimateRow

KEPT = 32  # rows per spell: the first estimate and the latest KEPT - 1
# a smaller move is not recorded: a job behind one past its expected end is told "in a minute" at
# every pass (seconds apart), and a row per pass per such job would be the loop's biggest write;
# a minute is also the lateness that counts (sim.result.LATE_AFTER_S), so no judged error moves by more
MIN_CHANGE_S = 60.0


def changed(old: float | None, new: float | None) -> bool:
    """Whether a new estimate is worth a row: it exists and moved by `MIN_CHANGE_S` or appeared."""
    return new is not None and (old is None or abs(new - old) >= MIN_CHANGE_S)


class Recorder:
    """The schedule step's memory of the estimate last recorded for each waiting job, so that an
    estimate drifting a little each pass (a job behind one past its expected end is told "in a
    minute" at every pass) is recorded once it has moved `MIN_CHANGE_S` from the last row, not
    compared with the column the last pass overwrote. After a restart it starts from the column."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[int, float]] = {}  # job id -> (attempt, estimate) last recorded

    def note(self, s: Session, now: float, estimates: Mapping[int, float | None],
             waiting: Mapping[int, tuple[int, float | None]]) -> int:
        """Record the estimates that changed. `estimates`: the cycle's, per job; `waiting`: per job
        read this pass, (attempt it waits to start as, its stored estimate). Returns rows written."""
        rows: list[tuple[int, int, float]] = []
        for jid, est in estimates.items():
            seen = waiting.get(jid)
            if seen is None or est is None:
                continue
            attempt, stored = seen
            last = self.last.get(jid)
            old = last[1] if last is not None and last[0] == attempt else stored
            if changed(old, est):
                rows.append((jid, attempt, est))
                self.last[jid] = (attempt, est)
        if len(self.last) > 2 * len(waiting):  # forget the jobs that stopped waiting
            self.last = {j: v for j, v in self.last.items() if j in waiting}
        record(s, rows, now)
        return len(rows)


def record(s: Session, rows: Sequence[tuple[int, int, float]], now: float) -> None:
    """Append (job id, attempt it waits to start as, estimated start) made at `now`, then trim
    each spell of those jobs to its first row and the latest `KEPT` - 1 (one statement)."""
    if not rows:
        return
    s.execute(insert(StartEstimateRow), [{"job_id": j, "attempt": a, "at": now, "est_start": e} for j, a, e in rows])
    t = StartEstimateRow
    spell = (t.job_id, t.attempt)
    ranked = (select(t.id, func.row_number().over(partition_by=spell, order_by=t.id).label("n"),
                     func.count().over(partition_by=spell).label("c"))
              .where(t.job_id.in_(sorted({j for j, _, _ in rows}))).subquery())
    doomed = select(ranked.c.id).where(ranked.c.n > 1, ranked.c.n <= ranked.c.c - (KEPT - 1))
    s.execute(delete(t).where(t.id.in_(doomed)))


def settle(s: Session, j: JobRow, now: float) -> EstimateOutcomeRow | None:
    """The job starts now (call before its attempt is counted: `j.attempt` + 1 is the one starting):
    its spell's outcome, if the spell had an estimate."""
    attempt = j.attempt + 1
    t = StartEstimateRow
    spell = select(t.at, t.est_start).where(t.job_id == j.id, t.attempt == attempt)
    first = s.execute(spell.order_by(t.id).limit(1)).first()
    if first is None:
        return None
    last = s.execute(spell.order_by(t.id.desc()).limit(1)).one()
    n = s.execute(select(func.count()).select_from(t).where(t.job_id == j.id, t.attempt == attempt)).scalar_one()
    row = EstimateOutcomeRow(job_id=j.id, attempt=attempt, job_class=j.job_class, team=j.team, user=j.user,
                             queued_since=j.queued_since, first_at=first.at, first_estimate=first.est_start,
                             last_at=last.at, last_estimate=last.est_start, started_at=now,
                             error_s=now - first.est_start, last_error_s=now - last.est_start, changes=n)
    if s.get(EstimateOutcomeRow, (j.id, attempt)) is None:  # a start re-done after a crash: the first one stands
        s.add(row)
    return row


def outcomes(s: Session, since: float | None = None) -> list[dict[str, Any]]:
    """Every outcome (of starts at or after `since`), oldest start first, as plain dicts."""
    t = EstimateOutcomeRow
    q = select(t).order_by(t.started_at, t.job_id, t.attempt)
    if since is not None:
        q = q.where(t.started_at >= since)
    cols = [c.name for c in t.__table__.columns]
    return [{c: getattr(r, c) for c in cols} for r in s.scalars(q)]


def purge(s: Session, job_ids: Sequence[int]) -> int:
    """Delete the estimate rows of `job_ids` (retention); the outcomes deleted."""
    ids = list(job_ids)
    s.execute(delete(StartEstimateRow).where(StartEstimateRow.job_id.in_(ids)))
    res = s.execute(delete(EstimateOutcomeRow).where(EstimateOutcomeRow.job_id.in_(ids)))
    return int(getattr(res, "rowcount", 0) or 0)
