"""The job's state transitions, one function each: the row, the audit event and the attempt's facts.

Every place that moves a job (the control loop's steps, a user's cancel or requeue) goes through
these, so a transition is written the same way wherever it happens: the job row's fields that
belong together change together, the event that explains it is recorded in the same transaction,
and an ending attempt leaves what the metrics count (`attempts.cause`, `lost_gpu_s`, `ended_at`).

    start_attempt    PENDING/REQUEUED → RUNNING: a new attempt row, "job.started"
    request_stop     RUNNING → (stopping): the stop kind and its start; the loop's stop sequence
                     (`control/loop/stops.py`) sends the signals
    end_attempt      the attempt row's outcome; the attempt's job token is revoked
    back_to_queue    → REQUEUED: placement and stop cleared, waits from now
    finish           → a terminal state, with exit code and signal
    cancel_waiting   PENDING/REQUEUED → CANCELLED

Each also notes what the job's `--mail-type` may want to hear (`services/notices.py`), sent
after the commit. Callers hold the write lock and an open transaction (`store.session.begin()`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from trainyard.services import notices
from trainyard.services.events import record
from trainyard.states import AttemptOutcome, JobState, StopKind, StopStage
from trainyard.store.models import AttemptRow, JobRow, TokenRow


def placement_text(placement: list[dict[str, Any]]) -> str:
    """`node-0:0,1, node-1:0,1`: where an attempt runs, as events and logs say it."""
    return ", ".join(f"{p['node']}:{','.join(map(str, p['gpus']))}" for p in placement)


def placement_gpus(placement: list[dict[str, Any]] | None) -> int:
    """The GPUs a placement holds, one per GPU index (a GPU shared by jobs that ask for GPU memory
    counts once for each of them), as the loop's `attained_gpu_s` and the accounting count them."""
    return sum(len(p.get("gpus") or ()) for p in placement or ())


def start_attempt(s: Session, j: JobRow, placement: list[dict[str, Any]], now: float, *,
                  configuring: str | None = None) -> None:
    """A new attempt on `placement`: committed before the backend launches it, so that a crash
    can leave a committed start without processes (requeued by reconcile) but never processes
    without a row. `configuring`: the attempt's nodes get ready first (the reason shown, e.g.
    ImagePull); the job is CONFIGURING until `control/loop/image_pull.py` turns it RUNNING."""
    j.attempt += 1
    state, reason = (JobState.CONFIGURING, configuring) if configuring else (JobState.RUNNING, "None")
    j.state, j.reason, j.start_time, j.end_time, j.est_start = state, reason, now, None, None
    j.retry_after = None
    j.placement, j.exit_code, j.signal = placement, None, None
    j.last_checkpoint = None
    _clear_stop(j)
    s.add(AttemptRow(job_id=j.id, attempt=j.attempt, placement=placement, started_at=now,
                     state=AttemptOutcome.RUNNING, gpus=placement_gpus(placement)))
    record(s, "scheduler", "job.started", f"attempt {j.attempt} started on {placement_text(placement)}",
           job_id=j.id, at=now, data={"attempt": j.attempt, "placement": placement})
    notices.note(j, "begin", now, s)


def request_stop(s: Session, j: JobRow, kind: StopKind, now: float, *, actor: str, event: str, message: str,
                 reason: str | None = None, completing: bool = False, node: str | None = None,
                 data: dict[str, Any] | None = None) -> None:
    """Mark a running job to be stopped for `kind`, from `now`; the stop sequence takes it from
    there (notice, SIGTERM, SIGKILL). `completing`: the job shows COMPLETING at once (a failed
    rank: the others are being stopped) rather than once SIGTERM is sent."""
    j.stop_kind, j.stop_since, j.stop_stage = kind, now, StopStage.NONE
    if reason is not None:
        j.reason = reason[:200]
    if completing:
        j.state = JobState.COMPLETING
    record(s, actor, event, message, job_id=j.id, node=node, at=now, data=data)
    if kind == StopKind.TIMEOUT:
        notices.note(j, "time_limit", now, s)


def attempt_row(s: Session, j: JobRow) -> AttemptRow | None:
    """The row of the job's current (or last) attempt."""
    return s.scalars(select(AttemptRow).where(AttemptRow.job_id == j.id, AttemptRow.attempt == j.attempt)).first()


def end_attempt(s: Session, j: JobRow, outcome: AttemptOutcome | str, reason: str, now: float, *,
                exit_code: int | None = None, signal: int | None = None, cause: str = "",
                lost_gpu_s: float = 0.0) -> None:
    """Record how the current attempt ended. Its job token dies with it: a token leaked through a
    log must not outlive the run."""
    a = attempt_row(s, j)
    if a is not None:
        a.state, a.reason, a.exit_code, a.signal, a.ended_at = outcome, reason, exit_code, signal, now
        a.cause, a.lost_gpu_s = cause, lost_gpu_s
    s.execute(update(TokenRow).where(TokenRow.job_id == j.id, TokenRow.role == "job").values(revoked=True))


def back_to_queue(j: JobRow, now: float, reason: str) -> None:
    """The job waits again (REQUEUED) from `now`, for a next attempt."""
    j.state, j.reason, j.queued_since = JobState.REQUEUED, reason, now
    j.placement, j.start_time, j.est_start = None, None, None
    _clear_stop(j)
    notices.note(j, "requeue", now)


def finish(j: JobRow, state: JobState | str, reason: str, now: float, *, exit_code: int | None = None,
           signal: int | None = None) -> None:
    """The job has ended for good in `state`."""
    j.state, j.reason, j.end_time = state, reason, now
    j.exit_code, j.signal = exit_code, signal
    _clear_stop(j)
    notices.note(j, "end", now)


def cancel_waiting(s: Session, j: JobRow, now: float, reason: str, *, actor: str, message: str,
                   data: dict[str, Any] | None = None) -> None:
    """A waiting job is cancelled before it ever (re)started."""
    j.state, j.reason, j.end_time, j.est_start = JobState.CANCELLED, reason, now, None
    record(s, actor, "job.cancelled", message, job_id=j.id, at=now, data=data)
    if reason.startswith("DependencyNeverSatisfied"):
        notices.note(j, "invalid_depend", now, s)
    notices.note(j, "end", now, s)


def _clear_stop(j: JobRow) -> None:
    j.stop_kind, j.stop_since, j.stop_stage = None, None, StopStage.NONE
