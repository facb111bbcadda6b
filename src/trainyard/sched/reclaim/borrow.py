"""Step 5f: borrowing within the cohort by preempting lower-priority borrowers (Kueue's
`borrowWithinCohort`, policy LowerPriority).

A job blocked by quota, whose GPUs beyond its team's nominal quota are within the team's
borrowing limit, may stop jobs of other teams of its cohort that are of lower priority and
borrow (whole jobs; only what their team borrows at the victim's level, so no team ends below its
nominal quota: the strict `VictimBudget`), and its own team's lower-priority jobs, least lost work
first, until the cohort can lend it what it needs and it fits. Slurm's QOS preemption stops
lower-priority jobs whatever the quotas. Before it, a team's interactive job one GPU beyond its
nominal waited for another team's batch jobs to end by themselves, past its class's max wait,
while the same job within nominal reclaimed in seconds (issue 35). Victims are past their min run
time and get their grace, as every victim. No ping-pong: a victim is of lower priority and, its
team left at or above nominal, needs to borrow to restart, so it can never stop its preemptor back.
"""

from __future__ import annotations

from trainyard.sched.budget import VictimBudget, borrowed_levels
from trainyard.sched.cycle.state import CycleState
from trainyard.sched.reclaim.victims import Found, Ok, find_victims, more_victims
from trainyard.sched.types import JobRequest, PendingJob, PreemptionKind, RunningJob


class Borrow:
    name = "borrow"

    def try_(self, st: CycleState, pj: PendingJob, prio: int) -> bool:
        pp, req = st.p.preemption, pj.req
        if not pp.borrow_within_cohort:
            return False
        if st.searches >= pp.max_searches or st.successes >= pp.max_preemptors:
            return False
        if prio <= st.lowest_preemptible or prio <= st.min_prio_now():
            return False  # nothing of lower priority runs
        if not may_borrow(st, req):
            return False
        memo = ("borrow", req.team, prio, req.pool, req.gpus, req.gpus_per_node, req.min_nodes, req.gpu_mem_mib,
                req.where, st.mask)
        if memo in st.no_victims:
            return False
        levels = cohort_borrowers(st, req, prio)
        if not levels:
            st.no_victims.add(memo)
            return False
        st.searches += 1  # given back below if it finds victims
        budget = VictimBudget(levels, st.prio_of, unlimited=(req.team,))
        candidate, classes, stopping, pool, mine = budget.candidate, st.snap.classes, st.stopping, req.pool, req.team

        def ok(r: RunningJob) -> bool:
            rq = r.req
            if rq.id in stopping or rq.pool != pool or classes[rq.job_class].priority >= prio:
                return False
            return rq.team == mine or (rq.team in levels and candidate(r))

        # Quota first (least lost work anywhere, then what more must go for it to fit), else
        # place first: the victims that make room on the nodes it would take, if their leaving
        # also gives the cohort room (the quota-first set can be spread so thin over the nodes
        # that the budget has nothing left for the node it needs).
        found = find_victims(st, req, ok, budget, None) or room_first(st, req, ok, budget)
        if found is None:
            st.no_victims.add(memo)
            return False
        st.searches -= 1
        victims, pl = found
        st.stop_for(pj, prio, victims, pl, kind_of=PreemptionKind.BORROW)
        return True


def cohort_borrowers(st: CycleState, req: JobRequest, prio: int,
                     teams: set[str] | None = None) -> dict[str, list[tuple[int, float]]]:
    """Per other team of `req`'s cohort that borrows in its pool and runs preemptible work of
    priority below `prio` (past its min run time; `teams`: those that run such work at all):
    what it borrows at each level (`budget.borrowed_levels`)."""
    team = st.snap.teams.get(req.team)
    if team is None or not team.cohort:
        return {}
    fl, flv, all_teams = st.fledger(), st.flevels(), st.snap.teams
    lower = teams if teams is not None else {
        t for t, jobs in st.eligible_by_team().items() if any(p < prio for p, _ in jobs)}
    out: dict[str, list[tuple[int, float]]] = {}
    for t in sorted(lower):
        other = all_teams.get(t)
        if t == req.team or other is None or other.cohort != team.cohort or fl.borrowed(t, req.pool) <= 0:
            continue
        out[t] = borrowed_levels(flv.get((t, req.pool), {}), fl.nominal(t, req.pool))
    return out


def may_borrow(st: CycleState, req: JobRequest) -> bool:
    """Whether `req` needs to borrow, and the GPUs it needs beyond its team's nominal quota are
    within the team's borrowing limit (step 5f's condition)."""
    team = st.snap.teams.get(req.team)
    if team is None or not team.cohort:
        return False
    fl = st.fledger()
    over = fl.used(req.team, req.pool) + req.min_gpus - fl.nominal(req.team, req.pool)
    limit = team.quota(req.pool).borrowing_limit
    return over > 0 and (limit is None or over <= limit)


def room_first(st: CycleState, req: JobRequest, ok: Ok, budget: VictimBudget) -> Found | None:
    """Victims chosen for room on the nodes `req` would take (`preemption.find_victims`),
    when their leaving also lets it fit its quota; else None."""
    victims = more_victims(st, st.fut(), req, ok, budget.tally(), [])
    if victims is None:
        return None
    ledger = st.fledger().copy()
    for v in victims:
        ledger.add(v.req.team, v.req.pool, -v.gpus)
    return (victims, None) if ledger.fits(req.team, req.pool, req.min_gpus) else None
