"""The victim search every reclaim strategy shares: quota first, then room on the nodes.

Why shared: each strategy differs only in who may be stopped (a predicate, `ok`) and how many
GPUs each team may lose (a `VictimBudget`); how the least-lost-work set is found, and how it is
tried against the cycle's `future` view, is one algorithm. Victims are past their min run time
(`CycleState.eligible_by_team`) and never chosen twice in a cycle (`CycleState.stopping`).
"""

from __future__ import annotations

from typing import Any, Callable

from trainyard.sched.budget import Tally, VictimBudget
from trainyard.sched.cluster import ClusterState, Placement
from trainyard.sched.cycle.state import CycleState
from trainyard.sched.engine_params import EngineParams
from trainyard.sched.placement import place
from trainyard.sched.preemption import find_victims as find_on_nodes
from trainyard.sched.types import JobClass, JobRequest, PendingJob, PreemptionKind, RunningJob

Ok = Callable[[RunningJob], bool]
Found = tuple[list[RunningJob], Placement | None]


def find_victims(st: CycleState, req: JobRequest, ok: Ok, budget: VictimBudget, quota_from: str | None) -> Found | None:
    """Victims for `req`, or None: first, if it does not fit its quota, jobs of `quota_from`
    (a team; None: every team) least lost work first until it does; then whatever more
    must go for it to fit (`place_victims`). No team loses more than its `budget` allows."""
    chosen: list[RunningJob] = []
    tally = budget.tally()
    ledger = st.fledger().copy()
    if not ledger.fits(req.team, req.pool, req.min_gpus):
        # The job takes its victims' place in the quota: never more than its own size
        # (plus the last victim's overshoot). A team further beyond what its cohort can lend
        # now (lenders took their quota back) gives that back to the lenders' reclaims, not
        # to one of its own jobs (a 1-GPU job stopped 220 of its team's jobs otherwise); a
        # job that replaces its own team's jobs GPU for GPU leaves every quota as it was.
        freed = 0
        for r in st.cheapest_first(quota_from):
            if not ok(r) or not tally.take(r):
                continue
            chosen.append(r)
            freed += r.gpus
            ledger.add(r.req.team, r.req.pool, -r.gpus)
            if ledger.fits(req.team, req.pool, req.min_gpus):
                break
            if freed >= req.min_gpus:
                if quota_from == req.team:
                    break  # in its own team's place
                return None
        else:
            return None
    return place_victims(st, req, ok, tally, chosen)


def place_victims(st: CycleState, req: JobRequest, ok: Ok, tally: Tally, chosen: list[RunningJob]) -> Found | None:
    """`chosen` plus whatever more must go for `req` to fit, or None if it cannot.

    With the placement `req` gets once they have left, when it was found on the way (None:
    the caller places it). The victims already chosen are released in the `future` view for
    the search and allocated back after it (exact, in integer MiB): a copy of the whole
    cluster per search cost more than the search itself.
    """
    state = st.fut()
    for v in chosen:
        state.release(v.placement)
    try:
        if chosen:
            pl, _ = place(state, req, req.min_nodes)
            if pl is not None:
                return chosen, pl
        more = more_victims(st, state, req, ok, tally, chosen)
        return None if more is None else (chosen + more, None)
    finally:
        for v in chosen:
            state.allocate(v.placement)


def more_victims(st: CycleState, state: ClusterState, req: JobRequest, ok: Ok, tally: Tally,
                 chosen: list[RunningJob]) -> list[RunningJob] | None:
    """The least-lost-work jobs whose leaving makes room for `req` on the nodes (`preemption.py`)."""
    taken = {v.req.id for v in chosen}
    max_node = state.max_gpus.get(req.pool, 0)
    if req.gpus_per_node is not None:
        n, per = req.min_nodes, req.gpus_per_node
    elif req.gpus <= max_node:
        n, per = 1, req.gpus
    else:
        n, per = -(-req.gpus // max_node), max_node
    more = find_on_nodes(state, req, n, per, st.node_jobs(), lambda r: r.req.id not in taken and ok(r),
                         st.lost, tally)
    return more or None


def in_own_team_place(st: CycleState, pj: PendingJob, prio: int, ok: Ok, memo: tuple[Any, ...],
                      kind: PreemptionKind) -> bool:
    """Steps 5c and 5d: stop the jobs of `pj`'s own team that `ok` allows, taking their place
    in the team's quota; a fruitless search is remembered (`memo`) for the rest of the cycle."""
    mine = pj.req.team
    st.share_searches += 1
    found = find_victims(st, pj.req, ok, VictimBudget({}, st.prio_of, unlimited=(mine,)), mine)
    if found is None:
        st.no_share.add(memo)
        return False
    st.share_searches -= 1
    victims, pl = found
    st.stop_for(pj, prio, victims, pl, shared=kind)
    return True


def remaining_s(req: JobRequest, progress_s: float, cls: JobClass, p: EngineParams) -> float:
    """A job's estimated remaining run time (at least a minute): its estimate, else its class's
    max run time, else the ordering's default for unknown run times."""
    est = req.est_runtime_s
    if est is None:
        est = cls.max_run_s or p.ordering.unknown_runtime_s
    return max(60.0, est - progress_s)
