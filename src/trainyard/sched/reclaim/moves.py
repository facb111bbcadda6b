"""Step 5e: move smaller jobs aside for a gang the pool's free GPUs could hold but no node does.

Best fit keeps large holes while it can, but in a pool busy with single-GPU jobs every node keeps
a few of them, and a gang waits until some node drains by chance (a day and more on the Philly
windows, with tens of GPUs free). Here the gang, once it has passed its quota and waited
`MoveParams.after_s`, stops the smaller single-node jobs on the nodes it would take (the
least-lost-work set, `victims.find_victims`), of any team, when (1) their classes checkpoint on
the notice, so each loses only its save and restart, (2) they are past their min run time
(eligible victims), and (3) all of them fit at once on the pool's free GPUs left once the gang
has its place (`movers_fit`), so no team loses GPUs for longer than a restart and no quota
changes hands. No ping-pong: a mover is smaller than the gang and single-node, so it never needs
a move itself (it fits where it is sent) and can never move the gang back.
"""

from __future__ import annotations

import math

from trainyard.sched.budget import VictimBudget
from trainyard.sched.cluster import Placement
from trainyard.sched.cycle.state import CycleState
from trainyard.sched.placement import place
from trainyard.sched.reclaim.victims import find_victims
from trainyard.sched.types import JobRequest, PendingJob, PreemptionKind, RunningJob


class Moves:
    name = "moves"

    def try_(self, st: CycleState, pj: PendingJob, prio: int) -> bool:
        mp, req = st.p.moves, pj.req
        if not mp.for_gangs or req.min_gpus < 2:
            return False
        if st.now - pj.queued_since < mp.after_s:
            return False
        if not st.searches_left():
            return False
        state = st.fut()
        if state.free_gpus(req.pool) < req.min_gpus:
            return False  # not fragmentation: the pool has too few free GPUs
        memo = ("move", req.pool, req.gpus, req.gpus_per_node, req.min_nodes, req.gpu_mem_mib, req.where, st.mask)
        if memo in st.no_share:
            return False
        stopping, pool, on_notice, size = st.stopping, req.pool, st.on_notice, req.min_gpus

        def ok(r: RunningJob) -> bool:
            rq = r.req
            return (rq.id not in stopping and rq.pool == pool and r.gpus < size and len(r.placement.nodes) == 1
                    and on_notice[rq.job_class])

        st.share_searches += 1
        teams = {t: math.inf for t in st.eligible_by_team()}
        found = find_victims(st, req, ok, VictimBudget.flat(teams, st.prio_of), None)
        if found is None or not movers_fit(st, req, *found):
            st.no_share.add(memo)
            return False
        st.share_searches -= 1
        victims, pl = found
        st.stop_for(pj, prio, victims, pl, shared=PreemptionKind.MOVE)
        return True


def movers_fit(st: CycleState, req: JobRequest, victims: list[RunningJob], pl: Placement | None) -> bool:
    """Whether every victim of a move fits on the pool's other free GPUs once `req` has its place."""
    view = st.fut().copy()
    for v in victims:
        view.release(v.placement)
    if pl is None:
        pl, _ = place(view, req, req.min_nodes)
        if pl is None:
            return False
    view.allocate(pl)
    for v in sorted(victims, key=lambda v: -v.gpus):
        got, _ = place(view, v.req, 1)
        if got is None:
            return False
        view.allocate(got)
    return True
