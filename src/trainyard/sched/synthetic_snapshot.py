"""A large synthetic scheduler snapshot, for benchmarks (`yard bench sched`) and scale tests.

    build_snapshot(nodes=1250, gpus_per_node=8, pending=5000, running=8000, seed=0) -> Snapshot

Deterministic from `seed`. What it holds:
- nodes `n0..` of `gpus_per_node` 80 GB GPUs, racks of 8 nodes, blocks of 4 racks; one pool;
- 4 teams in one cohort with nominal quotas 40/30/20/10% of the GPUs (largest remainder); the
  smallest team may borrow at most 10% more, the largest lends at most half of its quota;
- the three classes of the example config (interactive, training, batch);
- `running` jobs placed with `placement.place` + `allocate` (so the cluster state is consistent):
  mostly 1 GPU (a third of them sharing a GPU with a 20 or 40 GB request, co-located
  with the previous shared job while it fits), some 2/4/8 GPUs and a
  few 2-node gangs; teams drawn by quota and kept within nominal + borrowing limit. When the
  cluster is too full for the next shape, smaller ones are tried; if even a shared 1-GPU job no
  longer fits, there are fewer running jobs than asked;
- `pending` jobs of mixed classes and shapes (1–8 GPUs, 2–4 node gangs, elastic 1–4 nodes,
  shared-memory requests), all with `est_runtime_s` set;
- job ids: pending jobs `0..pending-1`, running jobs `pending..` (in the order drawn), so the two
  never collide and, as when they were strings `q<i>` and `r<i>`, every pending id sorts before
  every running one;
- decayed usage per team; `explain=True` (the control loop's setting).
"""

from __future__ import annotations

import math
import random
from typing import Any

from trainyard.sched.cluster import ClusterState, Node, Placement
from trainyard.sched.placement import place
from trainyard.sched.types import JobClass, JobRequest, PendingJob, Quota, RunningJob, Snapshot, Team

POOL = "default"
_GB = 1024  # MiB: the shapes below are written in GB, the engine takes MiB
CLASSES = {
    "interactive": JobClass("interactive", 300, False, 15 * 60.0, 0.0, 8 * 3600.0, 0.0),
    "training": JobClass("training", 200, True, 24 * 3600.0, 600.0, None, 120.0),
    "batch": JobClass("batch", 100, True, 3 * 86400.0, 0.0, None, 60.0),
}


def _nodes(n: int, gpn: int) -> list[Node]:
    return [Node(f"n{i}", gpn, 80 * _GB, POOL, "H100", f"b{i // 32}", f"r{i // 8}") for i in range(n)]


def _teams(total: int) -> dict[str, Team]:
    shares = {"t0": 0.4, "t1": 0.3, "t2": 0.2, "t3": 0.1}
    exact = {t: total * s for t, s in shares.items()}
    nominal = {t: math.floor(v) for t, v in exact.items()}
    for t in sorted(exact, key=lambda t: (-(exact[t] - nominal[t]), t))[: total - sum(nominal.values())]:
        nominal[t] += 1
    return {
        "t0": Team("t0", "org", {POOL: Quota(nominal["t0"], None, nominal["t0"] // 2)}),
        "t1": Team("t1", "org", {POOL: Quota(nominal["t1"])}),
        "t2": Team("t2", "org", {POOL: Quota(nominal["t2"])}),
        "t3": Team("t3", "org", {POOL: Quota(nominal["t3"], max(1, total // 10), None)}),
    }


def _running_shape(rng: random.Random, gpn: int) -> dict[str, Any]:
    u = rng.random()
    if u < 0.30:
        return {"gpus": 1, "gpu_mem_mib": rng.choice((20 * _GB, 40 * _GB))}
    if u < 0.90:
        return {"gpus": 1}
    if u < 0.95:
        return {"gpus": min(2, gpn)}
    if u < 0.98:
        return {"gpus": min(4, gpn)}
    if u < 0.995:
        return {"gpus": gpn}
    return {"gpus": 2 * gpn, "gpus_per_node": gpn, "min_nodes": 2, "max_nodes": 2}


def _pending_shape(rng: random.Random, gpn: int) -> dict[str, Any]:
    u = rng.random()
    if u < 0.10:
        return {"gpus": 1, "gpu_mem_mib": rng.choice((10 * _GB, 20 * _GB, 40 * _GB))}
    if u < 0.55:
        return {"gpus": 1}
    if u < 0.85:
        return {"gpus": min(rng.choice((2, 4, 8)), gpn)}
    if u < 0.95:
        n = rng.choice((2, 2, 3, 4))
        return {"gpus": n * gpn, "gpus_per_node": gpn, "min_nodes": n, "max_nodes": n}
    return {"gpus": gpn, "gpus_per_node": gpn, "min_nodes": 1, "max_nodes": rng.choice((2, 4))}


def _place_shared(state: ClusterState, req: JobRequest, partial: list[tuple[int, int]]) -> Placement | None:
    """A 1-GPU shared-memory job beside an earlier one, else on a whole free GPU.

    Same rules as `placement.place` for this shape, without its scan of every node (which makes
    building 8,000 running jobs take seconds)."""
    mem = req.gpu_mem_mib or 0
    while partial:
        i, g = partial[-1]
        if state.free_mib[i][g] >= mem:
            return Placement(((i, (g,)),), (mem,))
        partial.pop()
    whole, _why = place(state, JobRequest(req.id, req.team, req.job_class, req.submit_time, gpus=1, pool=req.pool))
    if whole is None:
        return None
    (i, (g,)), = whole.nodes
    partial.append((i, g))
    return Placement(((i, (g,)),), (mem,))


def build_snapshot(*, nodes: int = 1250, gpus_per_node: int = 8, pending: int = 5000, running: int = 8000,
                   seed: int = 0, now: float = 10 * 86400.0, explain: bool = True) -> Snapshot:
    """A consistent snapshot of the given size (see the module notes)."""
    rng = random.Random(f"snapshot:{seed}")
    node_list = _nodes(nodes, gpus_per_node)
    state = ClusterState(node_list)
    teams = _teams(nodes * gpus_per_node)
    names = list(teams)
    weights = [teams[t].quota(POOL).nominal for t in names]
    cap = {t: teams[t].quota(POOL).nominal + (teams[t].quota(POOL).borrowing_limit or 10**9) for t in names}
    used = dict.fromkeys(names, 0)
    classes_run = ("interactive", "training", "training", "training", "batch", "batch")
    run_jobs: list[RunningJob] = []
    fallbacks = ({"gpus": 1}, {"gpus": 1, "gpu_mem_mib": 20 * _GB}, {"gpus": 1, "gpu_mem_mib": 10 * _GB})
    partial: list[tuple[int, int]] = []  # (node, gpu) shared GPUs with memory left
    for i in range(running):
        placement = None
        for shape in (_running_shape(rng, gpus_per_node), *fallbacks):
            team = rng.choices(names, weights)[0]
            if used[team] + shape["gpus"] > cap[team]:
                team = min(names, key=lambda t: used[t] - teams[t].quota(POOL).nominal)
            cls = rng.choice(classes_run)
            start = now - rng.uniform(60.0, 2 * 86400.0)
            req = JobRequest(pending + i, team, cls, start - rng.uniform(0, 3600.0), pool=POOL,
                             est_runtime_s=rng.choice((3600.0, 4 * 3600.0, 86400.0, 3 * 86400.0)),
                             checkpoint_interval_s=1800.0 if cls != "interactive" else None, **shape)
            placement = _place_shared(state, req, partial) if req.gpu_mem_mib is not None else place(state, req)[0]
            if placement is not None:
                break
        if placement is None:
            break
        state.allocate(placement)
        used[req.team] += placement.gpus
        ci = req.checkpoint_interval_s or 1800.0
        last = start + math.floor((now - start) / ci) * ci
        run_jobs.append(RunningJob(req, placement, start, last, attempt=rng.choice((0, 0, 0, 1)),
                                   attained_gpu_s=rng.uniform(0, 3600.0) * placement.gpus))
    pend_jobs: list[PendingJob] = []
    classes_pend = ("interactive", "training", "training", "training", "batch", "batch", "batch")
    for i in range(pending):
        cls = rng.choice(classes_pend)
        submit = now - rng.uniform(0.0, 86400.0)
        req = JobRequest(i, rng.choice(names), cls, submit, pool=POOL,
                         est_runtime_s=rng.choice((900.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 2 * 86400.0)),
                         checkpoint_interval_s=1800.0 if cls != "interactive" else None,
                         **_pending_shape(rng, gpus_per_node))
        requeued = rng.random() < 0.1
        pend_jobs.append(PendingJob(req, attempt=1 if requeued else 0,
                                    queued_since=submit + (rng.uniform(0, now - submit) if requeued else 0.0),
                                    progress_s=rng.uniform(0, 7200.0) if requeued else 0.0,
                                    attained_gpu_s=rng.uniform(0, 7200.0) * req.min_gpus if requeued else 0.0))
    usage = {t: rng.uniform(0.5, 1.5) * teams[t].quota(POOL).nominal * 7 * 86400.0 for t in names}
    allocated: dict[tuple[str, str], int] = {}
    by_class: dict[tuple[str, str, str], int] = {}
    for r in run_jobs:  # what a control loop keeps up to date as jobs start and end
        key = (r.req.team, r.req.pool)
        allocated[key] = allocated.get(key, 0) + r.gpus
        ck = (r.req.team, r.req.pool, r.req.job_class)
        by_class[ck] = by_class.get(ck, 0) + r.gpus
    return Snapshot(now=now, cluster=state, teams=teams, classes=dict(CLASSES), running=tuple(run_jobs),
                    pending=tuple(pend_jobs), usage=usage, explain=explain, allocated=allocated,
                    allocated_by_class=by_class)
