"""One cycle of the trainyard policy, step by step (the steps of `sched/engine.py`'s docstring).

`Cycle.run` walks the pending jobs in order (step 2, `order.py`) and, for each, admits it
(step 3), lets it claim GPUs leaving jobs will free (step 4), tries the reclaim strategies in
the order below (step 5), reserves for it (step 6) or says why it waits (step 7, `explain.py`).

The order of the reclaim strategies, in one place (the first that finds victims wins):

- blocked by its team's quota (`STEPS_QUOTA`): 5 its own team's lower-priority jobs (only they
  give quota back), 5f lower-priority borrowers of its cohort, 5b time-sharing, 5c
  least-attained-service, 5d overdue;
- blocked by capacity (`STEPS_CAPACITY`): 5 priority and reclaim, 5b, 5c, 5d; and, when the
  pool has the GPUs but no node the shape (`Reason.TOPOLOGY`, `STEPS_FRAGMENTED`), 5e moves.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import Any, Iterable

from trainyard.sched.cycle.explain import explain, quota_reason
from trainyard.sched.cycle.order import after_their_bosses, in_turn, order
from trainyard.sched.cycle.reserve import reserve
from trainyard.sched.cycle.state import CycleState
from trainyard.sched.ordering import is_urgent
from trainyard.sched.reclaim.base import Strategy
from trainyard.sched.reclaim.borrow import Borrow
from trainyard.sched.reclaim.las import Las
from trainyard.sched.reclaim.moves import Moves
from trainyard.sched.reclaim.overdue import Overdue, held_back, overdue_first
from trainyard.sched.reclaim.priority import Priority
from trainyard.sched.reclaim.share import Share
from trainyard.sched.types import CycleResult, PendingJob, Reason, Start

STEPS_QUOTA: tuple[Strategy, ...] = (Priority(own_team_only=True), Borrow(), Share(), Las(), Overdue())
STEPS_CAPACITY: tuple[Strategy, ...] = (Priority(), Share(), Las(), Overdue())
STEPS_FRAGMENTED: tuple[Strategy, ...] = (Moves(),)


class Cycle(CycleState):
    """The state of one cycle (`CycleState`) and the walk of its steps; thrown away at its end."""

    def run(self) -> CycleResult:
        snap = self.snap
        keyed, n_first = order(self)
        levels = self.patience_levels
        below = self.p.share.below_gpu_s
        share_below = below if below is not None else -1.0
        las_below = self.p.las.below_gpu_s
        classes, now, failed, prio_of = snap.classes, self.now, self.failed, self.prio_of
        reasons = self.reasons if snap.explain else None
        overdue = overdue_first(self, keyed, n_first)
        for key, pj in after_their_bosses(self, in_turn(self, keyed, n_first)):
            r = pj.req
            if pj.held:
                self.pend(pj, Reason.HELD)
                continue
            if overdue and held_back(overdue, prio_of, r):
                self.pend(pj, Reason.RESERVATION)  # it would take the quota an older, larger job waits for
                continue
            if self.holds is not None:
                mask, why = self.holds.mask(r)
                if why is not None:
                    self.resv_est[r.id] = self.holds.start_of(r)
                    self.pend(pj, why)
                    continue
                self.holds.apply(mask, (self.cur(), self.future, self.long_state))
                self.mask = mask
            # Jobs alike in every way the steps below look at fail alike: capacity and quota only
            # shrink within a cycle until victims are chosen (which clears this memo), and
            # reservations make estimates matter (no memo then).
            alike = (r.team, r.pool, r.job_class, r.gpus, r.gpus_per_node, r.min_nodes, r.max_nodes, r.gpu_mem_mib,
                     r.where, key[1], bisect_right(levels, now - pj.queued_since), pj.attained_gpu_s < share_below,
                     pj.attained_gpu_s < las_below, self.mask)
            if failed:
                known = failed.get(alike)
                if known is not None and self.shadow == math.inf:
                    if reasons is not None:
                        reasons[r.id] = known
                        first = self.failed_by.get(alike)
                        if first is not None:
                            if first in self.resv_est:
                                self.resv_est[r.id] = self.resv_est[first]
                            if first in self.details:
                                self.details[r.id] = self.details[first]
                    continue
            prio = classes[r.job_class].priority
            reason = self.admit(pj, key)
            if reason is None:
                continue
            # Step 4: room that leaving jobs will free.
            if (self.leaving or self.stopping) and self.claim_leaving(pj, prio):
                self.pend(pj, Reason.PREEMPTING)
                continue
            # Step 5: the reclaim strategies, in their order.
            if reason == Reason.QUOTA:
                if _first_that_frees(STEPS_QUOTA, self, pj, prio):
                    self.pend(pj, Reason.PREEMPTING)
                else:
                    if reasons is not None:
                        quota_reason(self, pj, prio)
                    self.fail(pj, alike, reason)
                continue
            if _first_that_frees(STEPS_CAPACITY, self, pj, prio) or (
                    reason == Reason.TOPOLOGY and _first_that_frees(STEPS_FRAGMENTED, self, pj, prio)):
                self.pend(pj, Reason.PREEMPTING)
                continue
            # Step 6: reservation for urgent jobs.
            if is_urgent(key) and len(self.res.reservations) < self.p.backfill.max_reservations:
                if reserve(self, pj):
                    self.pend(pj, Reason.RESERVATION)
                    continue
            self.fail(pj, alike, reason)
        if snap.explain and self.reasons:
            explain(self, keyed)
        return self.res

    def claim_leaving(self, pj: PendingJob, prio: int) -> bool:
        """Step 4: whether `pj` fits once the jobs already leaving have left, and claimed their GPUs."""
        r = pj.req
        if self.fledger().fits(r.team, r.pool, r.min_gpus):
            pl, _ = self.place_in(self.fut(), r, r.min_nodes)
            if pl is not None and (pl.gpus <= r.min_gpus or self.fledger().fits(r.team, r.pool, pl.gpus)):
                self.claim(pl)
                self.hold_quota(r.team, r.pool, max(r.min_gpus, pl.gpus), prio)
                return True
        return False

    def fail(self, pj: PendingJob, alike: tuple[Any, ...], reason: Reason) -> None:
        """Nothing worked for this job; jobs alike will fare the same until victims are chosen."""
        if self.holds is not None and reason in (Reason.CAPACITY, Reason.TOPOLOGY, Reason.MEMORY) \
                and self.holds.blocked(pj.req, self.cur()):
            reason = Reason.RESERVED
            self.resv_est[pj.req.id] = None  # free GPUs it may not use: no estimate from them
        if self.shadow == math.inf:
            self.failed[alike] = reason
            self.failed_by[alike] = pj.req.id  # jobs alike get its estimate and detail too
        self.pend(pj, reason)

    def pend(self, pj: PendingJob, reason: Reason) -> None:
        if self.snap.explain:
            self.reasons[pj.req.id] = reason

    # Step 3.
    def admit(self, pj: PendingJob, key: Any) -> Reason | None:
        """None when `pj` started (at the largest size an elastic job can take); else why not."""
        req = pj.req
        if not self.ledger.fits(req.team, req.pool, req.min_gpus):
            return Reason.QUOTA
        state = self.cur()
        if state.free_gpus(req.pool) < req.min_gpus and req.gpu_mem_mib is None:
            return Reason.CAPACITY
        sizes: Iterable[int | None]
        if req.gpus_per_node is None:
            sizes = (None,)
        else:
            sizes = range(req.max_nodes, req.min_nodes - 1, -1)
        reason = Reason.CAPACITY
        for n in sizes:
            gpus = req.gpus if n is None or req.gpus_per_node is None else req.gpus_per_node * n
            if not self.ledger.fits(req.team, req.pool, gpus):
                reason = Reason.QUOTA
                continue
            view = state
            if self.long_state is not None and not self.ends_before_shadow(pj, gpus):
                view = self.long_state
            pl, why = self.place_in(view, req, n)
            if pl is None:
                if view is not state and self.place_in(state, req, n)[0] is not None:
                    why = Reason.RESERVATION
                reason = why or reason
                continue
            if pl.gpus > gpus and not self.ledger.fits(req.team, req.pool, pl.gpus):
                reason = Reason.QUOTA  # an exclusive job holds its nodes' every GPU, and is charged for them
                continue
            self.commit(pl)
            self.hold_quota(req.team, req.pool, pl.gpus, self.prio_of[req.job_class])
            self.res.starts.append(Start(req.id, pl))
            self.started.append((pj, pl.gpus))
            return None
        return reason

    def ends_before_shadow(self, pj: PendingJob, gpus: int) -> bool:
        est = pj.req.est_runtime_s
        if est is None:
            return False
        rate = gpus / pj.req.max_gpus
        return self.now + max(0.0, est - pj.progress_s) / rate <= self.shadow


def _first_that_frees(steps: Iterable[Strategy], st: CycleState, pj: PendingJob, prio: int) -> bool:
    """Whether one of `steps`, tried in order, chose victims for `pj` (the rest are not tried)."""
    for s in steps:
        if s.try_(st, pj, prio):
            return True
    return False
