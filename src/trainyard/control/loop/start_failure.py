"""An attempt whose work before its ranks start failed: an image's pull (`image_pull.py`) or a
dataset's staging (`data_staging.py`). One rule for both, as a Slurm prolog failure is one rule:

- the user's fault (no such image, a dataset that no longer hashes to its checksum, a source the
  owner may not read) fails the job: running it again changes nothing;
- the outside's (the registry or the source unreachable, the node's disk full) puts it back in the
  queue after a pause that grows with each such failure in a row, not counted against its retries,
  and fails it after `OUTSIDE_FAULTS_MAX` in a row, so that an outage does not spin it for ever;
- a job whose stop was asked meanwhile fails at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.backends.base import LaunchSpec
from trainyard.control.loop.context import LoopContext
from trainyard.services import transitions
from trainyard.services.events import record
from trainyard.states import AttemptOutcome, JobState
from trainyard.store.models import AttemptRow, JobRow

log = logging.getLogger("trainyard.loop")

OUTSIDE_FAULTS_MAX = 5  # outside failures in a row before the job fails
RETRY_PAUSE_S = (30.0, 60.0, 120.0, 300.0, 600.0)  # after the 1st, 2nd, ... outside failure in a row


@dataclass(frozen=True)
class Step:
    """A kind of work before the ranks: the job's reason and the message's start (`ImagePullError`),
    the attempt's cause when the user's or the outside's fault, and whose fault the outside is."""

    error: str
    user_cause: str
    outside_cause: str
    outside: str  # "the registry's or the node's"


def failed(ctx: LoopContext, spec: LaunchSpec, step: Step, message: str, node: str, outside_fault: bool,
           data: dict[str, Any]) -> None:
    """End `spec`'s attempt (if it is still the job's, before its ranks) as `step`'s failure."""
    now = ctx.clock()
    where = f" on {node}" if node else ""
    why = f"{step.error}: {message}{where}"[:200]
    log.warning("job %s attempt %s: %s", spec.job_id, spec.attempt, why)
    with ctx.lock, ctx.store.session.begin() as s:
        j = s.get(JobRow, spec.job_id)
        if j is None or j.attempt != spec.attempt or j.state not in (JobState.CONFIGURING, JobState.COMPLETING):
            return
        data = {**data, "node": node, "attempt": spec.attempt}
        n = faults_in_a_row(s, j, step.outside_cause) + 1 if outside_fault else 0  # this one counted
        if not outside_fault or n >= OUTSIDE_FAULTS_MAX or j.stop_kind is not None:
            transitions.end_attempt(s, j, AttemptOutcome.FAILED, why, now, cause=step.user_cause)
            transitions.finish(j, JobState.FAILED, why, now)
            record(s, "scheduler", "job.failed", f"attempt {spec.attempt}: {why}", job_id=j.id, at=now, data=data)
            return
        transitions.end_attempt(s, j, AttemptOutcome.REQUEUED, why, now, cause=step.outside_cause)
        transitions.back_to_queue(j, now, step.error)
        j.retry_after = now + RETRY_PAUSE_S[min(n, len(RETRY_PAUSE_S)) - 1]
        record(s, "scheduler", "job.requeued",
               f"attempt {spec.attempt}: {why}; {step.outside} fault ({n} in a row): "
               f"back in the queue in {j.retry_after - now:.0f}s, not counted against its retries",
               job_id=j.id, at=now, data=data)


def faults_in_a_row(s: Session, j: JobRow, cause: str) -> int:
    """The job's attempts just before this one that ended with `cause`, in a row."""
    n = 0
    for row in s.scalars(select(AttemptRow).where(AttemptRow.job_id == j.id, AttemptRow.attempt < j.attempt)
                         .order_by(AttemptRow.attempt.desc())):
        if row.cause != cause:
            break
        n += 1
    return n
