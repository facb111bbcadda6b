"""Choosing victims: the set of running jobs whose preemption makes room at the least lost work.

Who may be a victim is the engine's call (`engine.TrainyardPolicy._victim_kind`): lower priority,
or borrowing beyond quota, preemptible, past its min run time, not already leaving. This module
only answers: given those candidates, which ones to stop so that the job fits, losing the fewest
GPU-seconds of work since their last checkpoints?

Per node, candidates are taken cheapest first (lost work per GPU they free there) until enough
GPUs are usable; the job then goes to the cheapest node, or for a gang to the cheapest set of
nodes. A GPU shared by several jobs frees only when all of them go. Victims' teams are never
pushed below their nominal quota when the victim was chosen for borrowing (`budget`).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

from trainyard.sched.cluster import ClusterState
from trainyard.sched.types import JobId, JobRequest, RunningJob


def _node_option(state: ClusterState, i: int, need: int, mem: int | None, cands: list[RunningJob],
                 lost: Callable[[RunningJob], float], budget: Mapping[str, float]) -> tuple[float, list[RunningJob]] | None:
    free = list(state.free_mib[i])
    cap = state.cap_mib[i]
    want = cap if mem is None else mem

    def usable() -> int:
        return sum(1 for f in free if f >= want)

    if usable() >= need:
        return 0.0, []
    spent: dict[str, float] = {}
    chosen: list[RunningJob] = []
    cost = 0.0
    ordered = sorted(cands, key=lambda r: (lost(r) / max(1, r.gpus), r.req.id))
    for r in ordered:
        team = r.req.team
        if spent.get(team, 0) + r.gpus > budget.get(team, math.inf):
            continue
        spent[team] = spent.get(team, 0) + r.gpus
        chosen.append(r)
        cost += lost(r)
        for (n, gis), m in zip(r.placement.nodes, r.placement.mem_mib):
            if n == i:
                for g in gis:
                    free[g] += m
        if usable() >= need:
            return cost, chosen
    return None


def find_victims(state: ClusterState, req: JobRequest, n_nodes: int, per_node: int,
                 node_jobs: Mapping[int, list[RunningJob]], ok: Callable[[RunningJob], bool],
                 lost: Callable[[RunningJob], float], budget: Mapping[str, float],
                 max_options: int = 64) -> list[RunningJob] | None:
    """Victims whose leaving lets `req` fit on `n_nodes` nodes with `per_node` GPUs each, or None.

    `node_jobs` lists the running jobs on each node, `ok(job)` says who may be a victim, and
    `lost(job)` the GPU-seconds it would lose if stopped now. Nodes are examined most-free first
    and the search stops once `max_options` (at least 4 per node wanted) viable nodes are found:
    the cheapest victims among those, not a global optimum, to keep a cycle within milliseconds.
    """
    mem = req.gpu_mem_mib
    options: list[tuple[float, int, int, list[RunningJob]]] = []
    want = max(max_options, 4 * n_nodes)
    if mem is None:
        order = [i for free, members in reversed(list(enumerate(state.buckets.get(req.pool, ()))))
                 for i in sorted(members)]
    else:
        order = sorted((i for i, nd in enumerate(state.nodes) if nd.pool == req.pool and nd.healthy),
                       key=lambda i: (-state.usable_on_node(i, mem), i))
    for i in order:
        node = state.nodes[i]
        if node.gpus < per_node or (mem is not None and state.cap_mib[i] < mem):
            continue
        usable = state.usable_on_node(i, mem)
        cands = [r for r in node_jobs.get(i, ()) if ok(r)] if usable < per_node else []
        if usable < per_node:
            on_here = sum(len(g) for r in cands for n, g in r.placement.nodes if n == i)
            if usable + on_here < per_node:
                continue
        opt = _node_option(state, i, per_node, mem, cands, lost, budget)
        if opt is not None:
            options.append((opt[0], len(opt[1]), i, opt[1]))
            if len(options) >= want:
                break
    if len(options) < n_nodes:
        return None
    options.sort(key=lambda o: (o[0], o[1], o[2]))
    victims: dict[JobId, RunningJob] = {}
    for _, _, _, vs in options[:n_nodes]:
        for v in vs:
            victims[v.req.id] = v
    spent: dict[str, float] = {}
    for v in victims.values():
        spent[v.req.team] = spent.get(v.req.team, 0) + v.gpus
        if spent[v.req.team] > budget.get(v.req.team, math.inf):
            return None
    if not victims:
        return None
    return sorted(victims.values(), key=lambda r: r.req.id)
