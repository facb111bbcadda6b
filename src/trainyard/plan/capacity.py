"""Capacity planning: the smallest cluster, in nodes, whose simulated wait meets a target.

    find_min_nodes(evaluate, target, lo=..., start=...) -> CapacityAnswer

`evaluate(nodes) -> metrics dict` is one full simulation of the workload on a cluster of that
many nodes (the CLI builds it with `resize_workload` + `simulate`); it is passed in so the search
can be tested with a fake. The search assumes the metric does not get worse with more nodes
(true of a work-conserving policy up to simulation noise):

1. From `start` (a first guess, e.g. the nodes the average load needs), double until a probe meets
   the target (or `max_nodes` fails: no answer).
2. Binary search between the largest size known to fail (or `lo − 1`) and the smallest known to
   meet it, until they are `tolerance` nodes apart.

Every probe is kept, so the report shows the curve the answer came from. Each size is simulated
at most once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

from trainyard.sched.types import Quota, Team
from trainyard.sim.philly import largest_remainder, make_nodes
from trainyard.sim.workload import Workload


@dataclass(frozen=True, slots=True)
class Probe:
    nodes: int
    metrics: Mapping[str, float | int]
    ok: bool


@dataclass(slots=True)
class CapacityAnswer:
    nodes: int | None  # smallest size found to meet the target; None if even max_nodes fails
    metric: str
    target: float
    probes: list[Probe] = field(default_factory=list)  # in the order they were simulated

    def sorted_probes(self) -> list[Probe]:
        return sorted(self.probes, key=lambda p: p.nodes)


def find_min_nodes(evaluate: Callable[[int], Mapping[str, float | int]], target: float, *, lo: int = 1,
                   start: int | None = None, max_nodes: int = 4096, metric: str = "p99_wait_s",
                   tolerance: int = 1) -> CapacityAnswer:
    """The smallest node count in [lo, max_nodes] whose `metric` ≤ `target` (see the module notes).

    Raises:
        ValueError: lo < 1, max_nodes < lo, tolerance < 1, or `evaluate` returns no `metric`.
    """
    if lo < 1 or max_nodes < lo or tolerance < 1:
        raise ValueError(f"need 1 <= lo ({lo}) <= max_nodes ({max_nodes}) and tolerance >= 1")
    ans = CapacityAnswer(None, metric, target)
    seen: dict[int, bool] = {}

    def meets(n: int) -> bool:
        if n not in seen:
            m = evaluate(n)
            if metric not in m:
                raise ValueError(f"evaluate({n}) returned no {metric!r}")
            seen[n] = m[metric] <= target
            ans.probes.append(Probe(n, dict(m), seen[n]))
        return seen[n]

    n = min(max(lo, start if start is not None else lo), max_nodes)
    fail = lo - 1  # largest size known (or assumed) to fail
    while not meets(n):
        fail = n
        if n >= max_nodes:
            return ans
        n = min(max_nodes, max(n + 1, n * 2))
    ok = n
    while ok - fail > tolerance:
        mid = (ok + fail) // 2
        if meets(mid):
            ok = mid
        else:
            fail = mid
    ans.nodes = ok
    return ans


def min_nodes_for_jobs(workload: Workload, gpus_per_node: int) -> int:
    """The fewest nodes on which every job of the workload could run at all."""
    need = 1
    for j in workload.jobs:
        r = j.req
        n = r.min_nodes if r.gpus_per_node is not None else math.ceil(r.min_gpus / gpus_per_node)
        need = max(need, n)
    return need


def load_start(workload: Workload, gpus_per_node: int) -> int:
    """A first guess: the nodes the measured window's average offered load needs."""
    lo, hi = workload.measure_from, workload.measure_to
    if hi is None:
        hi = max((j.req.submit_time for j in workload.jobs), default=lo) + 1.0
    work = sum(j.duration_s * j.req.max_gpus for j in workload.jobs if workload.measured(j.req.submit_time))
    return max(1, math.ceil(work / max(1.0, hi - lo) / gpus_per_node))


def resize_workload(workload: Workload, n_nodes: int, gpus_per_node: int) -> Workload:
    """The same jobs on `n_nodes` nodes of `gpus_per_node` GPUs (same GPU memory as before;
    racks of 8 nodes, blocks of 4 racks), nominal quotas rescaled in proportion to the old ones
    (largest remainder, so they sum to the new cluster's GPUs)."""
    gpu_mem_mib = workload.nodes[0].gpu_mem_mib if workload.nodes else 80 * 1024
    model = workload.nodes[0].gpu_model if workload.nodes else "gpu"
    total = n_nodes * gpus_per_node
    teams: dict[str, Team] = {}
    pools = sorted({p for t in workload.teams.values() for p in t.quotas})
    scaled = {p: largest_remainder({t: float(tm.quota(p).nominal) for t, tm in workload.teams.items()}, total)
              for p in pools}
    for name, tm in workload.teams.items():
        teams[name] = Team(name, tm.cohort, {p: Quota(scaled[p][name], q.borrowing_limit, q.lending_limit)
                                             for p, q in tm.quotas.items()})
    return replace(workload, nodes=make_nodes(n_nodes, gpus_per_node, gpu_mem_mib, gpu_model=model), teams=teams,
                   name=f"{workload.name} resized to {n_nodes}x{gpus_per_node}",
                   notes=list(workload.notes) + [f"Resized to {n_nodes} nodes x {gpus_per_node} GPUs; nominal quotas "
                                                 "rescaled in proportion (largest remainder)."])
