"""FIFO: one queue in submit order, strictly, with head-of-line blocking.

What it models: the simplest batch scheduler (Slurm with `SchedulerType=sched/builtin` and no
backfill, or a plain Kubernetes queue): jobs are tried in order of `submit_time` (then id); a
requeued job keeps its original place. The first job of a pool that does not fit stops that pool's
queue for this cycle, even when later, smaller jobs would fit (head-of-line blocking). Pools are
independent queues (as Slurm partitions are), so a blocked pool does not block another.

What it leaves out: no team quotas, no fair share, no job-class priorities, no preemption, no
backfill, no reservations and no run-time estimates (every `est_start` is None). Held jobs are
skipped and do not block. Elastic jobs start at `max_nodes` if that fits now, else `min_nodes`.
"""

from __future__ import annotations

from trainyard.sched.baselines._common import Fitter, fifo_key, pools_of
from trainyard.sched.policy import gc_paused, register
from trainyard.sched.types import CycleResult, PendingInfo, Reason, Snapshot, Start


@register("fifo")
class Fifo:
    name = "fifo"

    @gc_paused
    def cycle(self, snap: Snapshot) -> CycleResult:
        res = CycleResult()
        explain = snap.explain
        state = snap.cluster.copy()
        fitter = Fitter(state)
        open_pools = set(pools_of(state))
        blocked: set[str] = set()
        for job in sorted(snap.pending, key=lambda j: fifo_key(j.req)):
            req = job.req
            if job.held:
                if explain:
                    res.pending[req.id] = PendingInfo(Reason.HELD, None)
                continue
            if req.pool in blocked:
                if not explain:
                    if open_pools <= blocked:
                        break
                    continue
                res.pending[req.id] = PendingInfo(Reason.PRIORITY, None)
                continue
            p, why = fitter.fit(req)
            if p is not None:
                fitter.take(p)
                res.starts.append(Start(req.id, p))
                continue
            blocked.add(req.pool)
            if explain:
                res.pending[req.id] = PendingInfo(why, None)
        return res
