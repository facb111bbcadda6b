"""Step 2 of a pass: the stop sequence, and the time limits that start one.

A running job past its time limit (or its class's max run time) is stopped (`timeout`). Every job
with a stop in progress moves along its sequence, one stage per pass at most:
- preemption and requeue send SIGUSR1 (the checkpoint notice), then SIGTERM once the class's
  grace period is over, then SIGKILL after `kill_wait_s`;
- cancel, time limit, a failed rank and a failed node go straight to SIGTERM, then SIGKILL after
  `kill_wait_s` (Slurm's KillWait);
- a hung job gets SIGKILL at once: a stopped process cannot act on SIGTERM.
A job that asked for a notice before its time limit (sbatch's `--signal=[B:]SIG@secs`,
`spec/signals.py`) gets SIG once per attempt when `secs` are left of that limit, before any stop:
what it does with it (checkpoint, exit) is its own business; the limit stops it as before.
The stage reached is stored, so a restarted loop carries on where the last one stopped; the
signals are sent after the transaction commits.
"""

from __future__ import annotations

import signal

from sqlalchemy import select

from trainyard.contracts import NOTICE_SIGNAL
from trainyard.control.loop.context import LoopContext
from trainyard.services import transitions
from trainyard.spec.signals import SignalSpec, parse_signal
from trainyard.services.events import record
from trainyard.states import ACTIVE_STATES, JobState, StopKind, StopStage
from trainyard.store.models import JobRow

SIGNAL_OF = {StopStage.NOTICE: NOTICE_SIGNAL, StopStage.TERM: signal.SIGTERM, StopStage.KILL: signal.SIGKILL}
SHOWN_REASON = {StopKind.PREEMPT: "Preempting", StopKind.REQUEUE: "Requeueing"}


def next_stage(kind: StopKind | str, stage: int, elapsed_s: float, grace_s: float, kill_wait_s: float) -> StopStage:
    """The stage a stop of `kind` should be at, `elapsed_s` after it began (never behind `stage`)."""
    kind, stage = StopKind(kind), StopStage(stage)
    if kind == StopKind.HUNG:
        return StopStage.KILL
    if kind.checkpoints_first:
        if stage < StopStage.NOTICE:
            return StopStage.NOTICE
        if elapsed_s < grace_s:
            return stage
        if stage < StopStage.TERM:
            return StopStage.TERM
        return StopStage.KILL if elapsed_s >= grace_s + kill_wait_s else stage
    if stage < StopStage.TERM:
        return StopStage.TERM
    return StopStage.KILL if elapsed_s >= kill_wait_s else stage


class Stops:
    def __init__(self, ctx: LoopContext) -> None:
        self.ctx = ctx

    def run(self, now: float, launching: frozenset[tuple[int, int]] = frozenset()) -> None:
        """`launching`: attempts still being launched (`control/loop/launch_threads.py`); their signals wait
        until the backend knows where to send them (the stop's clock runs on meanwhile)."""
        ctx = self.ctx
        sends: list[tuple[int, int, signal.Signals, bool]] = []  # (job, attempt, signal, to the batch shell)
        with ctx.lock, ctx.store.session.begin() as s:
            classes = ctx.configs.current(s).spec.classes
            grace = {c.name: c.grace_period for c in classes}
            max_run = {c.name: c.max_run_time for c in classes}
            for j in s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE_STATES))):
                if (j.id, j.attempt) in launching:
                    continue
                if j.stop_kind is None:
                    limits = [x for x in (j.time_limit_s, max_run.get(j.job_class)) if x]
                    notice = _notice_due(j, limits, now)
                    if notice is not None:
                        sends.append((j.id, j.attempt, notice.sig, notice.batch_only))
                        j.notice_sent_attempt = j.attempt
                        record(s, "scheduler", "job.signal",
                               f"sent {notice.sig.name} (--signal={notice.text()}: {notice.secs}s before the time limit)",
                               job_id=j.id, at=now, data={"signal": int(notice.sig), "stage": "notice_signal"})
                    if not (limits and j.start_time is not None and now - j.start_time >= min(limits)):
                        continue
                    transitions.request_stop(s, j, StopKind.TIMEOUT, now, actor="scheduler", event="job.timeout",
                                             message=f"time limit {min(limits):.0f}s reached; stopping")
                kind = StopKind(j.stop_kind or "")  # (set: before, or by request_stop above)
                stage = next_stage(kind, j.stop_stage, now - (j.stop_since or now), grace.get(j.job_class, 60.0),
                                   ctx.params.kill_wait_s)
                if stage <= j.stop_stage:
                    continue
                sig = SIGNAL_OF[stage]
                sends.append((j.id, j.attempt, sig, False))
                j.stop_stage = stage
                if stage >= StopStage.TERM:
                    j.state = JobState.COMPLETING
                j.reason = SHOWN_REASON.get(kind, j.reason)
                if stage > StopStage.NOTICE or kind.checkpoints_first:
                    record(s, "scheduler", "job.signal", f"sent {sig.name} ({kind})", job_id=j.id, at=now,
                           data={"signal": int(sig), "stage": int(stage)})
        for jid, att, sig, batch_shell in sends:
            if batch_shell:
                ctx.backend.signal(jid, att, sig, batch_shell=True)
            else:
                ctx.backend.signal(jid, att, sig)


def _notice_due(j: JobRow, limits: list[float], now: float) -> SignalSpec | None:
    """The job's --signal notice when it is due now and not yet sent to this attempt."""
    if not (j.notice_signal and limits and j.start_time is not None and j.notice_sent_attempt != j.attempt):
        return None
    spec = parse_signal(j.notice_signal)
    return spec if now - j.start_time >= min(limits) - spec.secs else None
