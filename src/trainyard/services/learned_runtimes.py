"""What a job will run, learned from the cluster's history: the start estimates' run time (issue 40).

A time limit is what a user dares not exceed, not what the job runs: users over-estimate by
factors of 2–5, so estimates built on limits promise starts far too late. Like Tiresias and the
Slurm sites that learn from sacct, the plane predicts a new job's run time from the same user's
jobs of the same name that completed in one attempt (a run cut by a preemption or failure says
little of a whole run): the median of the last `LAST` of them, at most the new job's limit. With
none, nothing is learned and the limit stands.

It is computed once, at submission, into `jobs.expected_runtime_s`, which the engine passes to
the start estimates only (`sched/estimate.py`); backfill and reservations keep the limit, since
the plane stops no job at its learned time (docs/scheduler.md, "Estimated start").
"""

from __future__ import annotations

import statistics

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.states import JobState
from trainyard.store.models import JobRow

LAST = 10  # completed runs the median is taken over, newest first


def past_runs(s: Session, user: str, name: str, last: int = LAST) -> list[float]:
    """Run times (end − start) of the user's newest `last` jobs named `name` that completed in one attempt."""
    j = JobRow
    q = (select(j.end_time - j.start_time)
         .where(j.user == user, j.state == JobState.COMPLETED, j.name == name, j.attempt == 1,
                j.end_time.is_not(None), j.start_time.is_not(None))
         .order_by(j.end_time.desc(), j.id.desc()).limit(last))
    return [max(0.0, float(v)) for v in s.scalars(q) if v is not None]


def expected(s: Session, user: str, name: str, limit_s: float | None) -> float | None:
    """The run time to expect of the user's next job named `name` (None: nothing learned)."""
    runs = past_runs(s, user, name)
    if not runs:
        return None
    m = statistics.median(runs)
    return m if limit_s is None else min(m, limit_s)
