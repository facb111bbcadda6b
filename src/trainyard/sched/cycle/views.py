"""The cycle's views of the cluster: what is free now, once the leaving jobs have left, and beside
the reservations made (step 1), with the placement memo they share.

Why views: a start takes GPUs now; a claim takes GPUs that jobs already leaving will free; a
backfilled job may not take what a reservation needs. Each is a copy-on-write `ClusterState` made
the first time a step asks for it, and every start or claim is written into each view that
exists, so no two steps hand out the same GPU.
"""

from __future__ import annotations

from trainyard.sched.cluster import ClusterState, Placement
from trainyard.sched.placement import place
from trainyard.sched.reservations import NO_MASK
from trainyard.sched.types import JobRequest, Reason, Snapshot


class Views:
    """`cur()` (free now), `fut()` (leaving jobs gone) and `long_state` (reserved GPUs taken away)."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.state: ClusterState | None = None  # copy-on-write of snap.cluster
        self.future: ClusterState | None = None  # state, with leaving jobs gone
        self.long_state: ClusterState | None = None  # state, with reserved GPUs taken away
        self.leaving = [r for r in snap.running if r.preempting]
        # Within a cycle, free capacity in a view only shrinks (starts and claims), except in
        # `future` when victims are chosen; so a shape that did not fit stays unfit until then.
        self.nofit: dict[tuple[object, ...], Reason] = {}
        # Admin reservations: the nodes the job being tried may not use (`reservations.py`).
        self.mask: frozenset[int] = NO_MASK

    def cur(self) -> ClusterState:
        if self.state is None:
            self.state = self.snap.cluster.copy()
        return self.state

    def fut(self) -> ClusterState:
        if self.future is None:
            self.future = self.cur().copy()
            for r in self.leaving:
                self.future.release(r.placement)
        return self.future

    def place_in(self, view: ClusterState, req: JobRequest, n: int | None) -> tuple[Placement | None, Reason | None]:
        key = (id(view), req.pool, req.gpus, req.gpus_per_node, n, req.gpu_mem_mib, req.where, self.mask)
        why = self.nofit.get(key)
        if why is not None:
            return None, why
        pl, why = place(view, req, n)
        if pl is None:
            self.nofit[key] = why or Reason.CAPACITY
        return pl, why

    def forget_future_fits(self) -> None:
        """Victims were chosen: the `future` view has more room, so its failed shapes may fit now."""
        fut_id = id(self.fut())
        self.nofit = {k: v for k, v in self.nofit.items() if k[0] != fut_id}

    def commit(self, placement: Placement) -> None:
        """A start: allocate in every view that exists."""
        self.cur().allocate(placement)
        for view in (self.future, self.long_state):
            if view is not None:
                take_where_free(view, placement)

    def claim(self, placement: Placement) -> None:
        """A future start (waiting for leaving victims): keep its GPUs from everyone else."""
        self.fut().allocate(placement)
        for view in (self.state, self.long_state):
            if view is not None:
                take_where_free(view, placement, whole=True)


def take_where_free(view: ClusterState, placement: Placement, whole: bool = False) -> None:
    """Mark a placement's GPUs used in another view, where they are still free there."""
    for (i, gis), mem in zip(placement.nodes, placement.mem_mib):
        free = view.free_mib[i]
        for g in gis:
            if whole or free[g] < mem:
                if free[g] > 0:
                    view.take_gpu(i, g)
            else:
                view.allocate(Placement(((i, (g,)),), (mem,)))
