"""The job's life as named values: job states, attempt outcomes, stop kinds and stop stages.

States are Slurm's (`squeue` shows the same names): a job waits PENDING (or REQUEUED, after an
attempt ended and it went back to the queue), is CONFIGURING while its nodes pull its image, runs RUNNING, is stopped through COMPLETING, and
ends in one of the terminal states. Each attempt of a job ends with an `AttemptOutcome`: an
attempt that was preempted ends PREEMPTED while its job goes back to the queue as REQUEUED.

A stop in progress is a `StopKind` (why the loop is stopping the attempt) and a `StopStage` (how
far the notice → SIGTERM → SIGKILL sequence has got): both are stored on the job row, so a control
loop restarted mid-stop carries on where the last one was.

The enums are `str`/`int` subclasses: they compare equal to the strings and numbers stored in the
database and shown by the API, so rows and JSON need no conversion. Standard library only: the CLI
imports this to read states without loading pydantic or SQLAlchemy.
"""

from __future__ import annotations

import enum


class JobState(enum.StrEnum):
    PENDING = "PENDING"
    REQUEUED = "REQUEUED"
    # placed, its nodes getting ready before any rank starts (Slurm's CF: node boot; here the
    # job's image pulled on each node, reason ImagePull): holds its GPUs, not yet its time
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"


# The one definition of each set: waiting for the scheduler, holding GPUs, and ended for good.
PENDING_STATES: tuple[JobState, ...] = (JobState.PENDING, JobState.REQUEUED)
ACTIVE_STATES: tuple[JobState, ...] = (JobState.CONFIGURING, JobState.RUNNING, JobState.COMPLETING)
TERMINAL_STATES: tuple[JobState, ...] = (
    JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED, JobState.TIMEOUT,
    JobState.NODE_FAIL, JobState.OUT_OF_MEMORY,
)
ALL_STATES: tuple[JobState, ...] = PENDING_STATES + ACTIVE_STATES + TERMINAL_STATES

# squeue's compact state codes (`squeue -t PD,R`), which Slurm users type out of habit.
STATE_CODES: dict[str, JobState] = {
    "PD": JobState.PENDING, "RQ": JobState.REQUEUED, "CF": JobState.CONFIGURING, "R": JobState.RUNNING, "CG": JobState.COMPLETING,
    "CD": JobState.COMPLETED, "F": JobState.FAILED, "CA": JobState.CANCELLED, "PR": JobState.PREEMPTED,
    "TO": JobState.TIMEOUT, "NF": JobState.NODE_FAIL, "OOM": JobState.OUT_OF_MEMORY,
}


class AttemptOutcome(enum.StrEnum):
    """How one attempt ended (the `attempts` table's state; RUNNING while it runs)."""

    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"
    REQUEUED = "REQUEUED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"


class StopKind(enum.StrEnum):
    """Why the loop is stopping a running attempt. PREEMPT, REQUEUE and IDLE_REQUEUE give the
    checkpoint notice first (the job may save its work); the others go straight to SIGTERM (HUNG
    to SIGKILL: a stopped process cannot act on SIGTERM)."""

    PREEMPT = "preempt"  # the scheduler needs its GPUs
    REQUEUE = "requeue"  # a person asked (yard requeue), or the job grows onto a returned node
    CANCEL = "cancel"  # yard cancel
    TIMEOUT = "timeout"  # its time limit or its class's max run time
    RANK_FAILED = "failed"  # one rank failed: the others are stopped
    NODE = "node"  # a node it runs on failed
    HUNG = "hung"  # its ranks stopped making progress (frozen)
    # an interactive allocation's end (issue 38): its session's command exited (the job ends with
    # that exit code), no terminal or port stayed attached past the connection grace, or it was idle
    SESSION = "session"
    LOST = "lost"
    IDLE = "idle"  # an idle allocation: it ends TIMEOUT, IdleTimeout
    # a job of a class with an idle policy (issue 39, spec/idle.py) idle past `after`: back to the
    # queue as a requeue goes (reason Idle), or CANCELLED (reason Idle)
    IDLE_REQUEUE = "idle_requeue"
    IDLE_CANCEL = "idle_cancel"

    @property
    def checkpoints_first(self) -> bool:
        """Whether the stop starts with the checkpoint notice (SIGUSR1) and the class's grace period."""
        return self in (StopKind.PREEMPT, StopKind.REQUEUE, StopKind.IDLE_REQUEUE)


class StopStage(enum.IntEnum):
    """How far a stop has got: the stored `stop_stage` (0 when no signal has been sent yet)."""

    NONE = 0
    NOTICE = 1  # SIGUSR1 sent: checkpoint at the next step and exit 75
    TERM = 2  # SIGTERM sent
    KILL = 3  # SIGKILL sent
