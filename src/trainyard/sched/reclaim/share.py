"""Step 5b: time-sharing of borrowed GPUs by attained service among jobs of the same priority.

A job that has held few GPU-seconds so far (`ShareParams.below_gpu_s`) may stop jobs of its own
priority that have held many (`above_gpu_s`): of its own team, or of teams that borrow (never
below their nominal quota). Least lost work first, as for any victim. Short jobs then do not
queue behind week-long ones; the long ones lose at most the work since their last checkpoint and
come back when the short ones are done.
"""

from __future__ import annotations

from trainyard.sched.budget import VictimBudget
from trainyard.sched.cycle.state import CycleState
from trainyard.sched.reclaim.victims import find_victims, remaining_s
from trainyard.sched.types import PendingJob, PreemptionKind, RunningJob


class Share:
    name = "share"

    def try_(self, st: CycleState, pj: PendingJob, prio: int) -> bool:
        p = st.p
        sp = p.share
        if sp.below_gpu_s is None or pj.attained_gpu_s >= sp.below_gpu_s:
            return False
        if not st.searches_left():
            return False
        req = pj.req
        # The victim must have, by estimate, `ratio` times the preemptor's remaining work.
        mine = remaining_s(pj.req, pj.progress_s, st.snap.classes[req.job_class], p) * req.min_gpus
        least = sp.ratio * mine
        memo = (req.team, prio, req.pool, req.gpus, req.gpus_per_node, req.min_nodes, req.gpu_mem_mib, req.where, least,
                st.mask)
        if memo in st.no_share:
            return False
        fl = st.fledger()
        # Only borrowed GPUs are shared: every victim's team stays at or above its nominal quota
        # (the preemptor's own team counting the preemptor), so no victim is ever owed quota.
        amounts: dict[str, float] = {}
        for team in st.eligible_by_team():
            b = fl.used(team, req.pool) + (req.min_gpus if team == req.team else 0) - fl.nominal(team, req.pool)
            if b > 0:
                amounts[team] = b
        if not amounts:
            return False
        budget = VictimBudget.flat(amounts, st.prio_of)
        now, above, max_lost, min_attempt = st.now, sp.above_gpu_s, sp.max_lost_s, sp.min_attempt_s
        classes, stopping, pool, lost = st.snap.classes, st.stopping, req.pool, st.lost

        def ok(r: RunningJob) -> bool:
            rq = r.req
            if rq.team not in amounts or rq.id in stopping or rq.pool != pool:
                return False
            if classes[rq.job_class].priority != prio:
                return False
            g = r.placement.gpus
            ran = now - r.start_time
            # An attempt that has not saved anything yet is never shared: restarted long jobs
            # would otherwise be stopped again and again before they make any progress.
            if ran < min_attempt or ran < (rq.checkpoint_interval_s or 0.0):
                return False
            if r.attained_gpu_s + g * ran < above or lost(r) > max_lost * g:
                return False
            return remaining_s(rq, r.progress_s + ran, classes[rq.job_class], p) * g >= least

        st.share_searches += 1
        # Quota first: any borrowing team's shareable jobs give cohort slack back.
        found = find_victims(st, req, ok, budget, None)
        if found is None:
            st.no_share.add(memo)
            return False
        st.share_searches -= 1
        victims, pl = found
        st.stop_for(pj, prio, victims, pl, shared=PreemptionKind.SHARE)
        return True
