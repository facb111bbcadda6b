"""Step 1c of a pass: interactive allocations whose client is gone end after the connection grace.

An allocation (`jobs.interactive`, services/allocations.py) lives as long as someone is attached:
a terminal or a forwarded port registered in the plane's `sessions` (services/sessions.py). One
that has had nothing attached for `interactive.connection_grace` seconds — counted from its
start when nothing ever attached, or from the plane's start after a restart — is stopped with
`StopKind.LOST` (straight to SIGTERM; it ends CANCELLED, reason ConnectionLost) and a
`job.connection_lost` event. A job that ends is forgotten by the registry.

It costs nothing when no allocation runs: which running attempts are interactive is asked of the
store once per attempt, when the backend first reports it, and remembered (with its start) until
the backend stops reporting it; the store is opened again only for an allocation past its grace.
The idle timeout is another step's, beside this one.
"""

from __future__ import annotations

from sqlalchemy import select

from trainyard.control.loop.context import Facts, LoopContext
from trainyard.services import transitions
from trainyard.states import JobState, StopKind
from trainyard.store.models import JobRow


class Interactive:
    def __init__(self, ctx: LoopContext) -> None:
        self.ctx = ctx
        # (job, attempt) the backend reports → the allocation's start (None: not an allocation)
        self._known: dict[tuple[int, int], float | None] = {}

    def run(self, facts: Facts, now: float) -> bool:
        """Stops the allocations past their grace; True when it stopped one."""
        sessions = self.ctx.sessions
        if sessions is None:
            return False
        seen = {(a.job_id, a.attempt) for a in facts.attempts}
        for key in [k for k in self._known if k not in seen]:
            if self._known.pop(key) is not None:
                sessions.forget(key[0])
        new = seen - self._known.keys()
        if new:
            self._learn(new, now)
        grace: float | None = None
        due = []
        for (job_id, _), start in self._known.items():
            if start is None:
                continue
            if grace is None:
                with self.ctx.store.session() as s:
                    grace = self.ctx.configs.current(s).spec.interactive.connection_grace
            since = sessions.detached_since(job_id, start)
            if since is not None and now - since >= grace:
                due.append(job_id)
        return bool(due) and self._stop(due, now)

    def _learn(self, keys: set[tuple[int, int]], now: float) -> None:
        ids = {k[0] for k in keys}
        with self.ctx.store.session() as s:
            rows = {r.id: r for r in s.execute(select(JobRow.id, JobRow.attempt, JobRow.start_time)
                                               .where(JobRow.id.in_(ids), JobRow.interactive.is_not(None)))}
        for job_id, attempt in keys:
            r = rows.get(job_id)
            self._known[(job_id, attempt)] = None if r is None else (r.start_time or now)

    def _stop(self, due: list[int], now: float) -> bool:
        ctx, stopped = self.ctx, False
        with ctx.lock, ctx.store.session.begin() as s:
            grace = ctx.configs.current(s).spec.interactive.connection_grace
            for j in s.scalars(select(JobRow).where(JobRow.id.in_(due), JobRow.state == JobState.RUNNING,
                                                    JobRow.stop_kind.is_(None))):
                transitions.request_stop(
                    s, j, StopKind.LOST, now, actor="scheduler", event="job.connection_lost",
                    message=f"no terminal or forwarded port attached for {grace:.0f}s "
                            "(interactive.connection_grace); ending the allocation",
                    data={"connection_grace": grace})
                stopped = True
        return stopped
