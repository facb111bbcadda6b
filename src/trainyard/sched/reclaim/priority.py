"""Step 5: preemption by priority, and reclaim of a team's nominal quota from borrowers.

A job within its team's nominal quota may reclaim GPUs from teams that borrow (after a patience:
GPUs often free up by themselves); a job may displace jobs of lower priority, of its own team or
of teams borrowing. Blocked by quota, only its own team's lower-priority jobs can give quota back
to it (`Priority(own_team_only=True)`, tried first in that case).
"""

from __future__ import annotations

from bisect import bisect_right

from trainyard.sched.budget import VictimBudget, borrowed_levels
from trainyard.sched.cycle.state import CycleState
from trainyard.sched.reclaim.victims import Ok, find_victims
from trainyard.sched.types import PendingJob, RunningJob


class Priority:
    """`try_` is the original `try_preempt`: lower priority, or reclaim for an owed team."""

    def __init__(self, own_team_only: bool = False) -> None:
        self.own_team_only = own_team_only
        self.name = "priority (own team)" if own_team_only else "priority"

    def try_(self, st: CycleState, pj: PendingJob, prio: int) -> bool:
        pp, own_team_only = st.p.preemption, self.own_team_only
        if st.searches >= pp.max_searches or st.successes >= pp.max_preemptors:
            return False
        req = pj.req
        fl = st.fledger()
        in_quota = fl.used(req.team, req.pool) + req.min_gpus <= fl.nominal(req.team, req.pool)
        in_quota = in_quota and st.now - pj.queued_since >= st.min_patience
        if not in_quota and (prio <= st.lowest_preemptible or prio <= st.min_prio_now()):
            return False  # nothing of lower priority runs, and it may not reclaim
        # Which victim classes the job has waited out the patience of is part of the shape: a job
        # that may not reclaim from a class yet must not make a patient one skip its search.
        patient = bisect_right(st.patience_levels, st.now - pj.queued_since)
        memo = (req.team, prio, in_quota, patient, own_team_only, req.pool, req.gpus, req.gpus_per_node, req.min_nodes,
                req.gpu_mem_mib, req.where, st.mask)
        if memo in st.no_victims:
            return False
        st.searches += 1  # given back below if it finds victims
        ok, budget = victim_rules(st, pj, prio, own_team_only)
        # Quota first: the team's own lower-priority jobs give quota back to it.
        found = find_victims(st, req, ok, budget, req.team)
        if found is None and in_quota and not own_team_only:
            # A team owed its quota gets it back even when the only victims are jobs larger than
            # what their teams borrow: stop such a job whole, the least-lost-work set of them.
            ok, budget = victim_rules(st, pj, prio, own_team_only, whole=True)
            found = find_victims(st, req, ok, budget, req.team)
        if found is None:
            st.no_victims.add(memo)
            return False
        victims, pl = found
        st.searches -= 1
        st.stop_for(pj, prio, victims, pl)
        return True


def victim_rules(st: CycleState, pj: PendingJob, prio: int, own_team_only: bool,
                 whole: bool = False) -> tuple[Ok, VictimBudget]:
    """Who may be stopped for `pj` (a predicate) and how many GPUs each team may lose.

    Of its own team: lower priority. Of another team: only what that team borrows at the
    victim's priority level (`budget.py`: its quota is filled by its highest-priority work
    first), and then if `pj` fits in its own team's nominal quota (reclaim) or is of higher
    priority. Never so many that a team falls below its nominal quota, unless `whole` (a
    reclaim whose only victims are jobs larger than what their team borrows: such a job is
    stopped whole, issue 20 part 9).
    """
    req = pj.req
    fl = st.fledger()
    in_quota = fl.used(req.team, req.pool) + req.min_gpus <= fl.nominal(req.team, req.pool)
    waited = st.now - pj.queued_since
    in_quota = in_quota and waited >= st.min_patience
    levels: dict[str, list[tuple[int, float]]] = {}
    if not own_team_only:
        flv = st.flevels()
        for team in st.eligible_by_team():
            if team != req.team and fl.borrowed(team, req.pool) > 0:
                levels[team] = borrowed_levels(flv.get((team, req.pool), {}), fl.nominal(team, req.pool))
    budget = VictimBudget(levels, st.prio_of, overshoot=whole, unlimited=(req.team,))
    candidate = budget.candidate
    classes, stopping, pool, patience = st.snap.classes, st.stopping, req.pool, st.patience

    def ok(r: RunningJob) -> bool:
        t = r.req.team
        if r.req.id in stopping or r.req.pool != pool:
            return False
        vcls = classes[r.req.job_class]
        lower = vcls.priority < prio
        if t == req.team:
            return lower
        if t not in levels or not candidate(r):
            return False
        return lower or (in_quota and waited >= patience(vcls))

    return ok, budget
