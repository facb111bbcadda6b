"""What the idle step (control/loop/idle.py) does to a job idle long enough: the warning, then the action.

Both are written in one transaction each, with the event that says it and the note the webhook
sends (`services/notices.py`, whatever the job's mail types: the owner should hear before the GPUs
go, and `yard alloc` asks for no mail):

    warn   at `after - warning`: a line to every attached terminal (`Sessions.warn`), event
           `job.idle_warning`, note `idle_warning` (IDLE_WARNING)
    act    at `after`: event `job.idle`, note `idle` (IDLE), and what the policy says (`Plan`):
             notify    nothing more
             requeue   a stop of kind IDLE_REQUEUE: the checkpoint notice, then SIGTERM after the
                       class's grace period; the attempt ends REQUEUED and the job waits again,
                       reason `Idle` (control/rules/outcome.py), its priority kept as a requeue's
             cancel    a stop of kind IDLE_CANCEL: SIGTERM; CANCELLED, reason `Idle`
             timeout   an allocation under requeue or cancel: a stop of kind IDLE, TIMEOUT,
                       reason `IdleTimeout` (issue 38's end: its session is over)

The cycle an idle job could go round (requeued, started again, idle again) ends with the count
of its idle requeues in a row (`idle_requeues_in_a_row`: its latest attempts whose cause is
`idle`, from the store, so a restarted plane counts the same): once it has `max_requeues` of them
the next idle stretch cancels it. An attempt that ended otherwise (it finished a preemption, it
failed) starts the count again. Every event carries `idle_since`, so the ledger can tell a job's
idle GPU-seconds from the plane's own records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.control.loop.context import LoopContext
from trainyard.services import notices, transitions
from trainyard.services.events import record
from trainyard.services.sessions import Sessions
from trainyard.spec.idle import IdlePolicy
from trainyard.states import JobState, StopKind
from trainyard.store.models import AttemptRow, JobRow

ACTOR = "scheduler"
STOP = {"requeue": StopKind.IDLE_REQUEUE, "cancel": StopKind.IDLE_CANCEL, "timeout": StopKind.IDLE}
REASON = {"requeue": "Idle", "cancel": "Idle", "timeout": "IdleTimeout"}
# what the terminal line and the events say will happen, or happened
WILL = {"notify": "its owner is told it is idle", "requeue": "it goes back to the queue",
        "cancel": "it is cancelled", "timeout": "it ends"}
DID = {"notify": "its owner is told (action notify)", "requeue": "requeued (Idle)",
       "cancel": "cancelled (Idle)", "timeout": "ended (IdleTimeout)"}


@dataclass(frozen=True)
class Plan:
    """What `act` will do to one job: `do` one of notify, requeue, cancel, timeout."""

    do: str
    requeues: int  # its idle requeues in a row so far
    why: str = ""  # a requeue turned into a cancel: why


def when(t: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))


def idle_requeues_in_a_row(s: Session, job_id: int, attempt: int) -> int:
    """How many of the job's attempts before `attempt`, counted back from the latest, ended
    requeued by its idle policy (cause `idle`)."""
    causes = s.scalars(select(AttemptRow.cause).where(AttemptRow.job_id == job_id, AttemptRow.attempt < attempt)
                       .order_by(AttemptRow.attempt.desc()).limit(101))
    n = 0
    for cause in causes:
        if cause != "idle":
            break
        n += 1
    return n


def plan(s: Session, j: JobRow, pol: IdlePolicy) -> Plan:
    """What the policy does to `j` now (module docstring)."""
    if pol.action == "notify":
        return Plan("notify", 0)
    if j.interactive:
        return Plan("timeout", 0)
    n = idle_requeues_in_a_row(s, j.id, j.attempt) if pol.action == "requeue" else 0
    if pol.action == "requeue" and n >= pol.max_requeues:
        return Plan("cancel", n, f"requeued idle {n} time(s) in a row already (max_requeues {pol.max_requeues})")
    return Plan(pol.action, n)


def _running(s: Session, job_id: int, attempt: int) -> JobRow | None:
    j = s.get(JobRow, job_id)
    if j is None or j.state != JobState.RUNNING or j.attempt != attempt or j.stop_kind is not None:
        return None
    return j


def warn(ctx: LoopContext, sessions: Sessions | None, job_id: int, attempt: int, pol: IdlePolicy,
         now: float, since: float) -> None:
    """The warning, `pol.warning` before the action (module docstring): at `after`, or, given by a
    late pass, `warning` from now (control/loop/idle.py acts no sooner)."""
    at = max(since + pol.after, now + pol.warning)
    with ctx.store.session() as s:
        j = _running(s, job_id, attempt)
        if j is None:
            return
        p = plan(s, j, pol)
    reason = f" with reason {REASON[p.do]}" if p.do in REASON else ""
    text = (f"job {job_id} has been idle for {now - since:.0f} s (no input, no CPU or GPU use); "
            f"{WILL[p.do]} at {when(at)} (in {max(0.0, at - now):.0f} s){reason} unless there is input: "
            "press any key to keep it")
    told = sessions.warn(job_id, text) if sessions is not None else 0
    with ctx.lock, ctx.store.session.begin() as s:
        j = _running(s, job_id, attempt)
        if j is None:
            return
        data: dict[str, Any] = {"idle_since": since, "action": p.do, "action_at": at, "ends_at": at,
                                "terminals": told, "attempt": attempt}
        record(s, ACTOR, "job.idle_warning", f"idle since {when(since)}: {WILL[p.do]} at {when(at)} unless used",
               job_id=job_id, at=now, data=data)
        notices.note(j, "idle_warning", now, s, always=True,
                     extra={"idle_since": since, "idle_ends_at": at, "idle_action": p.do})


def act(ctx: LoopContext, job_id: int, attempt: int, pol: IdlePolicy, now: float, since: float) -> str | None:
    """At `after`: the event, the note and the action (module docstring); returns what was done
    (None: the job is no longer running this attempt)."""
    with ctx.lock, ctx.store.session.begin() as s:
        j = _running(s, job_id, attempt)
        if j is None:
            return None
        p = plan(s, j, pol)
        message = (f"idle since {when(since)} ({pol.after:g} s with no input and CPU and GPU below "
                   f"{pol.below:g}%): {DID[p.do]}" + (f": {p.why}" if p.why else ""))
        data: dict[str, Any] = {"idle_since": since, "after": pol.after, "below": pol.below, "action": pol.action,
                                "done": p.do, "attempt": attempt, "idle_requeues": p.requeues}
        if p.do == "notify":
            record(s, ACTOR, "job.idle", message, job_id=job_id, at=now, data=data)
        else:
            transitions.request_stop(s, j, STOP[p.do], now, actor=ACTOR, event="job.idle", message=message,
                                     reason=REASON[p.do], data=data)
        notices.note(j, "idle", now, s, always=True, extra={"idle_since": since, "idle_action": p.do})
        return p.do
