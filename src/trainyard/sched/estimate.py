"""Estimated start times for pending jobs, and expected ends of running ones.

The estimate walks the pending jobs in the policy's order against a profile of aggregate free
GPUs per pool: GPUs free now, plus GPUs returned as running jobs reach their expected ends (from
run-time estimates, or the class's max run time). Each job takes its GPUs at the earliest moment
enough are free and gives them back after its own estimate. It ignores topology and memory (a
job may in truth need a particular node to free up), so it is a lower bound in spirit, shown as
Slurm shows START_TIME: a best guess that moves as the queue moves.
"""

from __future__ import annotations

import heapq
import math
from typing import Sequence

from trainyard.sched.types import JobClass, PendingJob, Reservation, RunningJob, Snapshot, Start


def expected_end(r: RunningJob, cls: JobClass, now: float) -> float:
    est = r.req.est_runtime_s
    if est is not None:
        rate = r.gpus / r.req.max_gpus
        end = r.start_time + max(0.0, est - r.progress_s) / rate
    elif cls.max_run_s:
        end = r.start_time + cls.max_run_s
    else:
        return math.inf
    return max(end, now + 60.0)  # overran its estimate: assume it ends soon


def estimate_starts(snap: Snapshot, pending_in_order: Sequence[PendingJob], starts: Sequence[Start],
                    reservations: Sequence[Reservation]) -> dict[str, float | None]:
    now = snap.now
    reserved = {r.job_id: r.start_at for r in reservations}
    started = {s.job_id: s.placement.gpus for s in starts}
    pending_by_id = {pj.req.id: pj for pj in snap.pending}
    out: dict[str, float | None] = {}
    pools = sorted({pj.req.pool for pj in pending_in_order})
    classes = snap.classes
    for pool in pools:
        # Returns come from two sources merged in time order: running jobs (sorted once) and the
        # jobs this walk places (a small heap).
        ends: list[tuple[float, int]] = []
        for r in snap.running:
            if r.req.pool == pool:
                e = expected_end(r, classes[r.req.job_class], now)
                if e != math.inf:
                    ends.append((e, r.gpus))
        avail = snap.cluster.free_gpus(pool)
        for jid, g in started.items():
            pj = pending_by_id[jid]
            if pj.req.pool == pool:
                avail -= g
                if pj.req.est_runtime_s is not None:
                    ends.append((now + pj.req.est_runtime_s, g))
        ends.sort()
        k, n_ends = 0, len(ends)
        heap: list[tuple[float, int]] = []
        t = now
        for pj in pending_in_order:
            if pj.req.pool != pool or pj.held:
                if pj.held:
                    out[pj.req.id] = None
                continue
            g = pj.req.min_gpus
            while avail < g and (k < n_ends or heap):
                if heap and (k >= n_ends or heap[0][0] < ends[k][0]):
                    t, back = heapq.heappop(heap)
                else:
                    t, back = ends[k]
                    k += 1
                avail += back
            if avail < g:
                out[pj.req.id] = None
                continue
            start = max(t, reserved.get(pj.req.id, t))
            out[pj.req.id] = start
            avail -= g
            if pj.req.est_runtime_s is not None:
                heapq.heappush(heap, (start + max(60.0, pj.req.est_runtime_s - pj.progress_s), g))
    return out
