"""A step of each pass: jobs that hold GPUs and do nothing are warned, then notified, requeued or
cancelled, as their class's idle policy says (issue 39, Deliver 3; issue 38's idle allocations are
its special case). The policy is the class's `idle:` (spec/idle.py; `policies` also reads the old
`idle_timeout`).

Every running job of a class with a policy (not being stopped, not of an exempt team; with the old
`idle_timeout`, the class's allocations only) is idle while all of: no input through an attached
terminal or forwarded port (`Sessions.last_input`), its processes' CPU and its GPUs below the
policy's `below` (control/loop/idle_usage.py). Per job:

    idle since = the latest of: its start (or when this loop first saw it: a restarted plane
                 gives every job its whole `after` again), its last input, the last reading that
                 found it busy
    at after - warning   once per idle stretch: the warning (control/loop/idle_actions.py `warn`)
    at after             once per idle stretch: event `job.idle`, the IDLE note and the action
                         (`act`: notify, requeue, cancel; an allocation ends TIMEOUT IdleTimeout)

Input or use starts a new stretch, with a warning and an action of its own when that one runs out
too. A job the backend cannot measure (no CPU or GPU reading, as on Slurm) is judged only if it is
an allocation, by its input. The step runs before the stops, so a job it stops is signalled in the
same pass.
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import select

from trainyard.control.loop import idle_actions
from trainyard.control.loop.context import LoopContext
from trainyard.control.loop.idle_usage import Track, due, sample, sample_every
from trainyard.spec.idle import IdlePolicy, policies
from trainyard.states import JobState
from trainyard.store.models import JobRow

__all__ = ["IdleJobs", "sample_every"]


class _Running(NamedTuple):
    id: int
    attempt: int
    job_class: str
    team: str
    started: float | None
    allocation: bool


class IdleJobs:
    """The step (module docstring); the plane's terminals and ports are `ctx.sessions`."""

    def __init__(self, ctx: LoopContext) -> None:
        self.ctx = ctx
        self._tracks: dict[int, Track] = {}

    def run(self, now: float) -> None:
        ctx = self.ctx
        with ctx.store.session() as s:
            pols = policies(ctx.configs.current(s).spec)
            # `interactive` is judged here, not in SQL: a JSON column's None may be stored as 'null'
            rows = [_Running(r[0], r[1], r[2], r[3], r[4], bool(r[5])) for r in s.execute(
                select(JobRow.id, JobRow.attempt, JobRow.job_class, JobRow.team, JobRow.start_time, JobRow.interactive)
                .where(JobRow.state == JobState.RUNNING, JobRow.job_class.in_(pols), JobRow.stop_kind.is_(None)))
            ] if pols else []
        live = set()
        for r in rows:
            pol = pols.get(r.job_class)
            if pol is None or r.team in pol.exempt_teams or (pol.allocations_only and not r.allocation):
                continue
            live.add(r.id)
            self._judge(r, pol, now)
        for job_id in set(self._tracks) - live:
            del self._tracks[job_id]

    def _judge(self, r: _Running, pol: IdlePolicy, now: float) -> None:
        sessions = self.ctx.sessions
        tr = self._tracks.get(r.id)
        if tr is None or tr.attempt != r.attempt:
            tr = self._tracks[r.id] = Track(r.attempt, now)
        if due(tr, now, pol.after):
            sample(self.ctx.backend, r.id, tr, now, pol.below)
        if not r.allocation and not tr.measured:
            return  # nothing says it is idle: not judged (idle_usage.py)
        typed = sessions.last_input(r.id) if sessions is not None else None
        since = max(r.started or 0.0, tr.seen, typed or 0.0, tr.busy_at or 0.0)
        idle_for = now - since
        if pol.warning > 0 and idle_for >= pol.after - pol.warning and tr.warned != since:
            # on time, or at a late pass (a loaded plane) that finds it already due: the action
            # then waits its `warning` after this, so no action ever comes unannounced
            tr.warned, tr.warned_at = since, now
            idle_actions.warn(self.ctx, sessions, r.id, r.attempt, pol, now, since)
        elif idle_for >= pol.after and tr.acted != since and (pol.warning <= 0 or now - tr.warned_at >= pol.warning):
            tr.acted = since
            done = idle_actions.act(self.ctx, r.id, r.attempt, pol, now, since)
            if done not in (None, "notify"):
                self._tracks.pop(r.id, None)  # being stopped: no longer judged
