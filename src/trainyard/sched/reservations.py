"""Admin reservations in a cycle: which nodes each pending job may not use, and why it may not run.

A reservation R (`types.AdminReservation`: nodes N, from `start` S to `end` E) does, at `now`:
1. While it is active (S <= now < E), a job without `--reservation=R` may not use N.
2. Before it starts, a job without it may not *start* on N if its time limit would carry it past
   S (Slurm's rule: nothing runs into a reservation it is not part of). A job with no limit of
   its own counts its class's max run time; a class without one, for ever.
3. A job with `--reservation=R` runs only on N and only while R is active; before S it waits
   (`Reason.RESV_WAIT`, Slurm's `Reservation`, estimated start S), after E, or for a name the
   configuration no longer has, it stays pending (`Reason.RESV_GONE`, Slurm's
   `ReservationDeleted`). Other reservations hold their nodes from it as from anyone (1, 2).
Once E has passed, R holds nothing. A job already running on N when R starts is not stopped
(what Slurm's IGNORE_JOBS flag does); nothing new lands there. Who may submit into R (its users
and teams) is checked at submission (`services/reservations.py`): the engine trusts the job's
`reservation`.

How the engine applies it (`Holds`): before a job is tried, the nodes it may not use are taken
out of every view of the cycle by marking them unhealthy (`ClusterState.set_health`), which
placement, the victim search and backfill reservations already skip; the mask changes only when
the next job's differs from the last one's, and the engine keys its memos of failed fits by it.
A cycle whose snapshot has no live reservation builds no `Holds` and costs nothing more.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

from trainyard.sched.cluster import ClusterState
from trainyard.sched.types import AdminReservation, JobClass, JobRequest, PendingJob, Reason

NO_MASK: frozenset[int] = frozenset()


class Holds:
    """The live reservations of one cycle, as node indices of its `ClusterState`."""

    def __init__(self, reservations: Sequence[AdminReservation], cluster: ClusterState,
                 classes: Mapping[str, JobClass], now: float):
        self.now = now
        self.by_name = {r.name: r for r in reservations}
        live = [r for r in reservations if r.end > now]
        # Only healthy nodes are masked: an unhealthy one is out of every placement already, and
        # must stay so when a mask is lifted.
        index = {n.name: i for i, n in enumerate(cluster.nodes) if n.healthy}
        self.nodes = {r.name: frozenset(index[n] for n in r.nodes if n in index) for r in live}
        self.active = [r for r in live if r.start <= now]
        self.future = sorted((r for r in live if r.start > now), key=lambda r: (r.start, r.name))
        self.max_run = {name: c.max_run_s for name, c in classes.items()}
        self._pool_nodes: dict[str, frozenset[int]] = {}
        self._cluster = cluster
        self.applied: frozenset[int] = NO_MASK  # the mask every view of the cycle carries now

    @classmethod
    def of(cls, reservations: Sequence[AdminReservation], cluster: ClusterState,
           classes: Mapping[str, JobClass], now: float, pending: Iterable[PendingJob]) -> "Holds | None":
        """None when nothing is held (no live reservation, and no job asks for one)."""
        if not any(r.end > now for r in reservations) and not any(pj.req.reservation for pj in pending):
            return None
        return cls(reservations, cluster, classes, now)

    def pool_nodes(self, pool: str) -> frozenset[int]:
        got = self._pool_nodes.get(pool)
        if got is None:
            got = self._pool_nodes[pool] = frozenset(
                i for i, n in enumerate(self._cluster.nodes) if n.pool == pool and n.healthy)
        return got

    def mask(self, req: JobRequest) -> tuple[frozenset[int], Reason | None]:
        """(node indices `req` may not use, None), or (NO_MASK, why it may not run at all now)."""
        own, now = req.reservation, self.now
        if own is not None:
            r = self.by_name.get(own)
            if r is None or r.end <= now:
                return NO_MASK, Reason.RESV_GONE
            if r.start > now:
                return NO_MASK, Reason.RESV_WAIT
        held: set[int] = set()
        for r in self.active:
            if r.name != own:
                held |= self.nodes[r.name]
        if self.future:
            limit = req.est_runtime_s or self.max_run.get(req.job_class)
            end = now + limit if limit else math.inf
            for r in self.future:
                if r.start >= end:
                    break
                if r.name != own:
                    held |= self.nodes[r.name]
        if own is not None:
            held |= self.pool_nodes(req.pool) - self.nodes[own]
        return (frozenset(held) if held else NO_MASK), None

    def apply(self, mask: frozenset[int], views: Iterable[ClusterState | None]) -> None:
        """Make `mask` the nodes out of use in every view (each carries `applied` until now)."""
        if mask == self.applied:
            return
        back, out = self.applied - mask, mask - self.applied
        for v in views:
            if v is None:
                continue
            for i in back:
                v.set_health(i, True)
            for i in out:
                v.set_health(i, False)
        self.applied = mask

    def blocked(self, req: JobRequest, view: ClusterState) -> bool:
        """Whether the mask, not the cluster, kept `req` from starting: its pool has the GPUs it
        asks for once the masked nodes' free GPUs are counted (a job in its own reservation waits
        for that reservation's nodes: its usual reason)."""
        if req.reservation is not None or not self.applied:
            return False
        extra = sum(view.free_whole[i] for i in self.applied if view.nodes[i].pool == req.pool)
        return extra > 0 and view.free_gpus(req.pool) + extra >= req.min_gpus

    def start_of(self, req: JobRequest) -> float | None:
        """The start of the reservation `req` waits for, if it waits for one."""
        r = self.by_name.get(req.reservation) if req.reservation else None
        return r.start if r is not None and r.start > self.now else None
