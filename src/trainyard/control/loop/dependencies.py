"""Step 3 of a pass: jobs waiting on a `--dependency` join the queue once it holds, in this same pass.

A job whose dependency never can hold is cancelled (`DependencyNeverSatisfied`, Slurm's
`kill_invalid_depend`). Jobs are settled in id order, so a cancelled stage's dependents, which
came later, see it cancelled in the same pass and go the same way. The verdicts themselves are
pure (`services.dependencies.verdict`); the targets' states come from the store.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.control.loop.context import LoopContext
from trainyard.services import dependencies, transitions
from trainyard.services.events import record
from trainyard.services.jobs import dependency_targets, free_reason, singleton_blocker
from trainyard.states import PENDING_STATES, JobState
from trainyard.store.models import JobRow


class Dependencies:
    def __init__(self, ctx: LoopContext) -> None:
        self.ctx = ctx

    def run(self, now: float) -> None:
        with self.ctx.lock, self.ctx.store.session.begin() as s:
            settle(s, now)


def settle(s: Session, now: float) -> int:
    """Settle every job waiting on a dependency; returns how many became ready. Those ready get
    their reason back (None, or a begin time's, or a hold's) and become eligible from now."""
    waiting = list(s.scalars(select(JobRow).where(JobRow.dependency_pending.is_(True),
                                                  JobRow.state.in_(PENDING_STATES)).order_by(JobRow.id)))
    if not waiting:
        return 0
    parsed = {j.id: dependencies.parse(j.dependency or "") for j in waiting}
    targets = dependency_targets(s, sorted({i for d in parsed.values() for i in dependencies.job_ids(d)}))
    ready = 0
    for j in waiting:
        deps = parsed[j.id]
        blocker = singleton_blocker(s, j.name, j.user, j.id) if any(d.kind == "singleton" for d in deps) else None
        verdict, why = dependencies.verdict(deps, targets, blocker)
        if verdict == "met":
            j.dependency_pending = False
            if not j.held:
                j.reason, j.eligible_time = free_reason(j.begin_time, now), max(now, j.begin_time or now)
            record(s, "scheduler", "job.dependency_met", f"dependency {j.dependency} met", job_id=j.id, at=now)
            ready += 1
        elif verdict == "never":
            j.dependency_pending = False
            transitions.cancel_waiting(s, j, now, "DependencyNeverSatisfied", actor="scheduler",
                                       message=f"cancelled: {why}", data={"dependency": j.dependency})
            if j.id in targets:
                targets[j.id] = dependencies.Target(JobState.CANCELLED, targets[j.id].started)
    return ready
