"""Step 6: a reservation for an urgent job that still does not fit (EASY backfill's shadow).

The earliest time, by the running jobs' estimated ends, when its placement frees up; those GPUs
are kept from jobs that would still run then (`CycleState.long_state`), and from later
reservations (`CycleState.reserved_gpus`), so a backfilled job never delays a reservation.
"""

from __future__ import annotations

import math

from trainyard.sched.cluster import Placement
from trainyard.sched.cycle.state import CycleState
from trainyard.sched.estimate import expected_end
from trainyard.sched.placement import memory_ever_fits, place
from trainyard.sched.types import JobId, PendingJob, Reservation


def ends(st: CycleState) -> list[tuple[float, JobId, Placement]]:
    """The running jobs' expected ends, earliest first (leaving ones at their grace's end)."""
    if st.ends_memo is None:
        out = []
        for r in st.snap.running:
            cls = st.snap.classes[r.req.job_class]
            e = st.now + cls.grace_s if (r.preempting or r.req.id in st.stopping) else expected_end(r, cls, st.now)
            if e != math.inf:
                out.append((e, r.req.id, r.placement))
        out.sort(key=lambda x: (x[0], x[1]))
        st.ends_memo = out
    return st.ends_memo


def reserve(st: CycleState, pj: PendingJob) -> bool:
    """Whether a reservation was made for `pj` (added to the cycle's result)."""
    req = pj.req
    if not memory_ever_fits(st.snap.cluster, req):  # capacities, not what is free
        return False  # no GPU of its pool is big enough: no end of any job helps
    view = (st.long_state or st.cur()).copy()
    need = req.min_gpus
    step = max(1, need // 4)
    since_try = need
    held = st.reserved_gpus
    for end, _, pl in ends(st):
        view.release(pl)
        if held:  # an earlier reservation's GPUs stay out of this one's view when they free up
            for i, gis in pl.nodes:
                for g in gis:
                    if (i, g) in held:
                        view.take_gpu(i, g)
        since_try += pl.gpus
        if view.free_gpus(req.pool) < need or since_try < step:
            continue
        since_try = 0
        got, _ = place(view, req, req.min_nodes)
        if got is not None:
            st.res.reservations.append(Reservation(req.id, max(end, st.now), got.node_indices))
            if st.long_state is None:
                st.long_state = st.cur().copy()
            for (i, gis), _m in zip(got.nodes, got.mem_mib):
                for g in gis:
                    st.long_state.take_gpu(i, g)
                    held.add((i, g))
            st.shadow = min(st.shadow, max(end, st.now))
            return True
    return False
