"""Static partitions: each team owns its nominal quota and nothing more (Philly-style VCs).

What it models: the static split of a shared cluster into per-team virtual clusters, as Microsoft's
Philly ran it (Jeon et al., ATC'19) and as Slurm does with one partition per team and a
`GrpTRES=gres/gpu=N` limit. A team may hold at most `team.quota(pool).nominal` GPUs of a pool;
idle GPUs of other teams are never lent (no cohort, no `borrowing_limit`). Within a team the
queue is FIFO by `submit_time` (then id) and strict: a team's head job that does not fit (its cap
or the free GPUs) blocks that team only. Placement is still on the shared node set: the cap is the
partition, no nodes are pinned to a team.

What it leaves out: Philly's opportunistic use of other VCs' idle GPUs and its preemption of such
jobs, any priority or class ordering inside a team, preemption, backfill, and run-time estimates
(`est_start` is always None). A job larger than its team's whole nominal quota could never run;
rather than block its team forever it is skipped (reason QUOTA), as a real partition would reject
it at submission. Teams missing from `snap.teams` have no quota and run nothing.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush

from trainyard.sched.baselines._common import Fitter, shape_gpus, shapes
from trainyard.sched.policy import gc_paused, register
from trainyard.sched.types import CycleResult, JobId, PendingInfo, PendingJob, Reason, Snapshot, Start


def _fifo(job: PendingJob) -> tuple[float, JobId]:
    return (job.req.submit_time, job.req.id)  # fifo_key(job.req)


@register("partition")
class Partition:
    name = "partition"

    @gc_paused
    def cycle(self, snap: Snapshot) -> CycleResult:
        res = CycleResult()
        explain = snap.explain
        state = snap.cluster.copy()
        fitter = Fitter(state)
        used: dict[tuple[str, str], int] = {}
        for r in snap.running:
            k = (r.req.team, r.req.pool)
            used[k] = used.get(k, 0) + r.placement.gpus
        blocked: set[tuple[str, str]] = set()
        limits: dict[tuple[str, str], int] = {}

        def cap(team: str, pool: str) -> int:
            t = snap.teams.get(team)
            return t.quota(pool).nominal if t is not None else 0

        def consider(job: PendingJob) -> bool:
            """Try one (non-held, non-blocked) job in FIFO order; True if its team is now blocked."""
            req = job.req
            key = (req.team, req.pool)
            limit = limits.get(key)
            if limit is None:
                limit = limits[key] = cap(req.team, req.pool)
            need = shape_gpus(req, shapes(req)[-1])
            if need > limit:
                if explain:
                    res.pending[req.id] = PendingInfo(Reason.QUOTA, None)
                return False  # can never run in this partition: skipped, does not block
            room = limit - used.get(key, 0)
            if need > room:
                p, why = None, Reason.QUOTA
            elif state.free_gpus(req.pool) == 0 and req.gpu_mem_mib is None:
                p, why = None, Reason.CAPACITY
            else:
                p, why = fitter.fit(req, allow=lambda g: g <= room)
            if p is not None:
                fitter.take(p)
                used[key] = used.get(key, 0) + p.gpus
                res.starts.append(Start(req.id, p))
                return False
            blocked.add(key)
            if explain:
                res.pending[req.id] = PendingInfo(why, None)
            return True

        if explain:
            for job in sorted(snap.pending, key=_fifo):
                req = job.req
                if job.held:
                    res.pending[req.id] = PendingInfo(Reason.HELD, None)
                elif (req.team, req.pool) in blocked:
                    res.pending[req.id] = PendingInfo(Reason.PRIORITY, None)
                else:
                    consider(job)
            return res

        # Without explanations only the jobs up to each team's first blocked one matter: keep a
        # FIFO heap per (team, pool) and merge their heads, instead of sorting the whole queue.
        # The jobs considered, and their order, are exactly those of the loop above.
        groups: dict[tuple[str, str], list[tuple[float, JobId, PendingJob]]] = {}
        for job in snap.pending:
            if job.held:
                continue
            req = job.req
            k = (req.team, req.pool)
            g = groups.get(k)
            if g is None:
                groups[k] = [(req.submit_time, req.id, job)]
            else:
                g.append((req.submit_time, req.id, job))
        heads = []
        for k, g in groups.items():
            heapify(g)
            heads.append((g[0][0], g[0][1], k))
        heapify(heads)
        while heads:
            k = heappop(heads)[2]
            g = groups[k]
            if not consider(heappop(g)[2]) and g:
                heappush(heads, (g[0][0], g[0][1], k))
        return res
