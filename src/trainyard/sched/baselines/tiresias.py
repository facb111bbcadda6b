"""Tiresias: Discretized Two-Dimensional Least-Attained-Service (Gu et al., NSDI'19).

What it models:
- Attained service in two dimensions, GPUs x time: a job's GPU-seconds so far
  (`attained_gpu_s`, plus gpus x (now - start) for a running attempt). No run-time estimates.
- K = 2 priority queues split at `thresholds` = (16 GPU-hours,): a job whose attained service is
  below 57,600 GPU-s is in queue 0, otherwise queue 1. The paper tunes K and the thresholds per
  cluster and finds K = 2 enough; 16 GPU-hours is the configuration Pollux (Qiao et al., OSDI'21)
  evaluated Tiresias with (petuum/adaptdl, branch osdi21-artifact, simulator/tiresias.py), whose
  published mean JCT on its workloads (4,038 s) this simulator reproduces within 1% (bench/README).
  `tiresias-3200` keeps the parameters this baseline shipped with before (3,200 GPU-s, about
  53 minutes on one GPU, and starvation promotion at 4x): on the Philly windows it churns,
  stopping jobs 2-16x as often for a higher mean JCT, so it is not the published Tiresias.
- Within a queue, FIFO by arrival (submit time), as in the paper (section 4.2): a job keeps its
  place when it is preempted, so jobs of one queue do not take turns (which, with checkpoints
  every 30 minutes and a 10-minute min run time, would stop every job before it saves anything).
- Each cycle, per pool: the desired set is built by walking all jobs (running and pending) in
  priority order (queue, then FIFO) and admitting greedily by GPU count up to the pool's healthy
  capacity (jobs that do not fit are skipped, not blocking). Running jobs outside it are
  preempted; pending jobs inside it start as soon as they can be placed.
- The starvation guard (the paper's PROMOTE knob), off as in Pollux's configuration
  (`starve_limit` None); when set, a pending job that has waited longer than `starve_limit` times
  its executed time goes back to queue 0. Executed time is approximated as attained GPU-seconds /
  its GPUs (the snapshot has no "last run time").

What it leaves out: Tiresias' placement profiler and consolidation for skewed models (placement
here is the shared gang placement), the Gittins-index variant (it needs a job-size distribution),
team quotas and job-class priorities (ignored, except that non-preemptible classes and jobs
younger than their class `min_run_s` are never preempted and keep their GPUs off the desired
count). The desired set counts GPUs, not shapes; undesired running jobs are preempted only on
nodes where a waiting desired job would then fit. Elastic jobs run at their
minimum size. Jobs under a preemption notice count as leaving (their GPUs are counted as coming
free), so no one is preempted twice for the same gap. The simulator prices a preemption as
the runtime does it (a save on the notice, then the restart), as the paper's prototype
checkpoints on preemption; a class that ignores notices loses its work since the last
checkpoint. `est_start` is
always None.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from operator import itemgetter

from trainyard.sched.baselines._common import Classes, Fitter, shape_gpus, shapes
from trainyard.sched.placement import place
from trainyard.sched.policy import gc_paused, register
from trainyard.sched.types import (
    CycleResult, JobId, PendingInfo, PendingJob, Preempt, PreemptionKind, Reason, RunningJob, Snapshot, Start,
)

_RANK = itemgetter(0, 1, 2)


PAPER_THRESHOLD_GPU_S = 16 * 3600.0


@register("tiresias")
class Tiresias:
    name = "tiresias"

    def __init__(self, thresholds: tuple[float, ...] = (PAPER_THRESHOLD_GPU_S,), starve_limit: float | None = None):
        self.thresholds = tuple(sorted(thresholds))
        self.starve_limit = starve_limit

    def queue(self, attained: float) -> int:
        for k, t in enumerate(self.thresholds):
            if attained < t:
                return k
        return len(self.thresholds)

    @gc_paused
    def cycle(self, snap: Snapshot) -> CycleResult:
        res = CycleResult()
        now, explain = snap.now, snap.explain
        state = snap.cluster.copy()
        fitter = Fitter(state)
        classes = Classes(snap)
        th = self.thresholds
        starve = self.starve_limit

        # Step 1: every job's queue and FIFO key; pinned (unpreemptible now) jobs keep their GPUs.
        # (`bisect_right(th, a)` is `self.queue(a)`: the number of thresholds at or below a.)
        pinned: dict[str, int] = defaultdict(int)
        entries: dict[str, list[tuple[int, float, JobId, int, RunningJob | PendingJob, bool]]] = defaultdict(list)
        for r in snap.running:
            if r.preempting:
                continue  # leaving: its GPUs are counted as coming free
            rq = r.req
            gpus = r.placement.gpus
            cls = classes[rq.job_class]
            if not (cls.preemptible and now - r.start_time >= cls.min_run_s):  # may_preempt
                pinned[rq.pool] += gpus
                continue
            a0 = r.attained_gpu_s
            q = bisect_right(th, a0 + gpus * (now - r.start_time))
            entries[rq.pool].append((q, rq.submit_time, rq.id, gpus, r, True))
        for j in snap.pending:
            req = j.req
            if j.held:
                if explain:
                    res.pending[req.id] = PendingInfo(Reason.HELD, None)
                continue
            q = bisect_right(th, j.attained_gpu_s)
            gpus = shape_gpus(req, shapes(req)[-1])
            if starve is not None and q > 0 and gpus > 0:
                executed = j.attained_gpu_s / gpus
                if now - j.queued_since > starve * executed:
                    q = 0  # PROMOTE: starved jobs go back to the top queue
            entries[req.pool].append((q, req.submit_time, req.id, gpus, j, False))

        # Step 2: per pool, the desired set by GPU count; starts and preemptions follow from it.
        pending_by_id = {j.req.id: j for j in snap.pending}
        for pool in sorted(entries):
            cap = state.total_gpus(pool) - pinned[pool]
            out: list[RunningJob] = []
            waiting: list[JobId] = []
            es = entries[pool]
            es.sort(key=_RANK)
            for _, _, jid, gpus, job, running in es:
                desired = gpus <= cap
                if desired:
                    cap -= gpus
                if running:
                    if not desired:
                        out.append(job)  # type: ignore[arg-type]
                    continue
                if not desired:
                    if explain:
                        res.pending[jid] = PendingInfo(Reason.PRIORITY, None)
                    continue
                req = job.req
                if req.gpu_mem_mib is None and state.free_gpus(pool) < gpus:
                    p, why = None, Reason.CAPACITY
                else:
                    p, why = fitter.fit(req, elastic=False)
                if p is not None:
                    fitter.take(p)
                    res.starts.append(Start(jid, p))
                    continue
                waiting.append(jid)
                if explain:
                    res.pending[jid] = PendingInfo(why, None)
            if out and waiting:
                # Placement-aware, as Tiresias' prototype places before it preempts: stop only the
                # undesired jobs on nodes where a waiting desired job would then be placed. A
                # preemption that lets nobody start would only throw work away (and on gangs
                # that need whole nodes, it would do so forever).
                trial = state.copy()
                for r in out:
                    trial.release(r.placement)
                freed_for: dict[int, JobId] = {}
                for jid in waiting:
                    job = pending_by_id[jid]
                    p, _ = place(trial, job.req, job.req.min_nodes)
                    if p is not None:
                        trial.allocate(p)
                        for n in p.node_indices:
                            freed_for.setdefault(n, jid)
                for r in out:
                    hit = [freed_for[n] for n in r.placement.node_indices if n in freed_for]
                    if hit:
                        res.preemptions.append(Preempt(r.req.id, PreemptionKind.PRIORITY, hit[0]))
                if explain:
                    for jid in waiting:
                        res.pending[jid] = PendingInfo(Reason.PREEMPTING, None)
        return res


@register("tiresias-3200")
class TiresiasShortQueue(Tiresias):
    """The parameters the `tiresias` baseline shipped with before issue 20: a 3,200 GPU-s
    threshold and starvation promotion at 4x the executed time. Kept for comparison: it preempts
    far more often than the published configuration (module docstring)."""

    name = "tiresias-3200"

    def __init__(self, thresholds: tuple[float, ...] = (3200.0,), starve_limit: float | None = 4.0):
        super().__init__(thresholds, starve_limit)
