"""An ended attempt's goodput ledger (issue 39): its allocated GPU-seconds split into the buckets
of `contracts.LEDGER_BUCKETS`, stored once in `attempts.ledger` when the reconcile step ends it.

The facts are gathered as the reports gather a running attempt's (`services/goodput_facts.py`:
the runtime's phase files through `jobfs`, bounded, no link followed; the attempt's telemetry and
first output; the class's idle threshold), with the one fact only the loop still holds at the
end: when the plane asked the attempt to stop (`jobs.stop_since`, cleared once the job is back in
the queue or finished). Call it after `transitions.end_attempt` (the row has its end and lost work)
and before the job's stop is cleared. The split itself is `services/goodput.py`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from trainyard.contracts import JobDir
from trainyard.services import goodput, goodput_facts
from trainyard.store.models import AttemptRow, JobRow


def store_ledger(s: Session, j: JobRow, a: AttemptRow | None, jd: JobDir, spec: Any, now: float) -> dict[str, float]:
    """Split the ended attempt `a` of job `j` and store its ledger; returns it ({} without a row)."""
    if a is None:
        return {}
    stop_at = j.stop_since if j.stop_kind is not None else None
    f = goodput_facts.attempt_facts(s, a, now, jd=jd, tasks_per_node=j.tasks_per_node, stop_at=stop_at,
                                    below=goodput_facts.idle_below(spec, j.job_class))
    a.ledger = goodput.split(f)
    return a.ledger
