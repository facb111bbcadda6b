"""The trainyard policy: one pure scheduling cycle, written as numbered steps (after Kueue's).

    TrainyardPolicy().cycle(snapshot) -> CycleResult

1. Ledger and views. Quota usage per team from the running jobs; a working copy of the free
   capacity (`now`), and a lazily built `future` view where jobs already leaving (preempting) have
   left, so their GPUs can be claimed by the job they were preempted for.
2. Order. Pending jobs sorted by `ordering.sort_key`: priority, urgency (aging toward max wait),
   in-quota before borrowing, then shortest estimated remaining GPU-time with fair share.
3. Admit. For each job in order: quota check (nominal + cohort borrowing, `QuotaLedger.fits`),
   then an all-or-nothing placement (`placement.place`), at the largest size an elastic job can
   take. A job that would run past a reservation's shadow time may only use GPUs the reservation
   does not need (EASY backfill: a backfilled job never delays a reservation).
4. Claim. A job that does not fit now but fits once the jobs already leaving have left claims
   those GPUs and waits (reason `preempting`); nothing new is preempted for it.
5. Preempt. Otherwise, a job within its team's nominal quota may reclaim GPUs from teams that
   borrow; a job may displace jobs of lower priority (of its own team, or of teams borrowing).
   Victims must be preemptible and past their min run time; among them, the set that loses the
   least work since its last checkpoint is chosen (`preemption.find_victims`). The job claims the
   freed GPUs and starts when the victims have left, in a later cycle.
   5b. Time-sharing (`share.below_gpu_s`; None turns it off): a job that has held few GPU-seconds
   may stop same-priority jobs that have held many, lose little since their last checkpoint and
   have much more work left, but only GPUs their teams borrow (`reclaim.share.Share`).
   5c. Least-attained-service within a team's own quota, for the teams that ask (`reclaim.las.Las`).
   5d. Overdue: a job pending `overdue.at` of its class's max wait may stop its own team's
   smaller jobs of its priority submitted after it, so that a team's stream of small jobs cannot
   starve its large one (`reclaim.overdue.Overdue`).
   5e. Moves: a gang that the pool's free GPUs could hold but no node's (fragmentation) stops
   smaller jobs that checkpoint on the notice and fit elsewhere at once (`reclaim.moves.Moves`).
   5f. Borrowing within the cohort (`preemption.borrow_within_cohort`; Kueue's `borrowWithinCohort`): a job
   blocked by quota whose GPUs beyond its team's nominal are within the team's borrowing limit
   may stop lower-priority jobs of other teams of its cohort, only what those teams borrow
   (never below their nominal quota), so that the cohort can lend it what it needs
   (`reclaim.borrow.Borrow`; tried right after its own team's lower-priority jobs, before 5b-5d).
6. Reserve. An urgent job (waited `ordering.reserve_at` of its max wait) that still does not fit gets a
   reservation: the earliest time, by the running jobs' estimated ends, when its placement frees
   up; those GPUs are kept from jobs that would still run then, and from later reservations.
7. Explain. With `snapshot.explain`, every job left pending gets a reason and an estimated start.
   A job blocked by quota that no step can help says which limit holds it (`cycle.explain.quota_reason`):
   its team's borrowing limit, or a cohort whose lendable GPUs are held by work it may not stop;
   a job that will borrow once its victims are past their min run time gets that time as its
   estimate. Jobs already leaving count as gone at their grace's end, not at their time limit.

Where each step lives: step 1 in `sched/cycle/state.py` (ledgers, memos) over
`sched/cycle/views.py` (the views); step 2 `sched/cycle/order.py`; steps 3, 4 and the walk itself
`sched/cycle/run.py`, which also names the order of step 5's strategies (`STEPS_QUOTA`,
`STEPS_CAPACITY`, `STEPS_FRAGMENTED`); each strategy one module of `sched/reclaim/` behind
`reclaim.base.Strategy` (`priority.py`, `borrow.py`, `share.py`, `las.py`, `overdue.py`,
`moves.py`; the victim search they share in `victims.py`); step 6 `sched/cycle/reserve.py`;
step 7 `sched/cycle/explain.py`. The parameters, one group per step, are `EngineParams`
(`sched/engine_params.py`).

Admin reservations (`reservations.py`) take the nodes a job may not use out of every view before
the job is tried (its mask), and keep a job whose reservation is not active out of the steps.

No ping-pong: a victim must have run its class's min run time in its current attempt, victims are
only ever of lower priority or borrowing beyond quota (so the preemptor can never qualify as a
victim of its victim), a job waiting on leaving victims never triggers more preemption, and a
victim is tried only after the job it was stopped for while that job waits (`Snapshot.stopped_for`).
"""

from __future__ import annotations

from trainyard.sched.cycle.run import Cycle
from trainyard.sched.engine_params import EngineParams
from trainyard.sched.policy import gc_paused, register
from trainyard.sched.types import CycleResult, Snapshot

__all__ = ["EngineParams", "TrainyardPolicy"]


class TrainyardPolicy:
    name = "trainyard"

    def __init__(self, params: EngineParams | None = None):
        self.params = params or EngineParams()

    @gc_paused
    def cycle(self, snap: Snapshot) -> CycleResult:
        return Cycle(snap, self.params).run()


register("trainyard")(TrainyardPolicy)
