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
from typing import Mapping

from trainyard.sched.cluster import ClusterState, gb_to_mib
from trainyard.sched.types import JobRequest, RunningJob


def _node_option(state: ClusterState, i: int, need: int, mem: int | None, cands: list[RunningJob], now: float,
                 budget: Mapping[str, float]) -> tuple[float, list[RunningJob]] | None:
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
    ordered = sorted(cands, key=lambda r: (r.lost_if_stopped(now) / max(1, r.gpus), r.req.id))
    for r in ordered:
        team = r.req.team
        if spent.get(team, 0) + r.gpus > budget.get(team, math.inf):
            continue
        spent[team] = spent.get(team, 0) + r.gpus
        chosen.append(r)
        cost += r.lost_if_stopped(now)
        for (n, gis), m in zip(r.placement.nodes, r.placement.mem_mib):
            if n == i:
                for g in gis:
                    free[g] += m
        if usable() >= need:
            return cost, chosen
    return None


def find_victims(state: ClusterState, req: JobRequest, n_nodes: int, per_node: int,
                 on_node: Mapping[int, list[RunningJob]], now: float,
                 budget: Mapping[str, float]) -> list[RunningJob] | None:
    """Victims whose leaving lets `req` fit on `n_nodes` nodes with `per_node` GPUs each, or None."""
    mem = None if req.gpu_mem is None else gb_to_mib(req.gpu_mem)
    options: list[tuple[float, int, int, list[RunningJob]]] = []
    # Only nodes holding a candidate can change; for a gang, nodes that already fit count too.
    nodes = set(on_node)
    if n_nodes > 1:
        if mem is None:
            for k, members in enumerate(state.buckets.get(req.pool, ())):
                if k >= per_node:
                    nodes.update(members)
        else:
            nodes.update(i for i in range(len(state.nodes)) if state.usable_on_node(i, mem) >= per_node)
    for i in sorted(nodes):
        node = state.nodes[i]
        if node.pool != req.pool or not node.healthy or node.gpus < per_node:
            continue
        if mem is not None and state.cap_mib[i] < mem:
            continue
        cands = on_node.get(i)
        opt = _node_option(state, i, per_node, mem, cands or [], now, budget)
        if opt is not None:
            options.append((opt[0], len(opt[1]), i, opt[1]))
    if len(options) < n_nodes:
        return None
    options.sort(key=lambda o: (o[0], o[1], o[2]))
    victims: dict[str, RunningJob] = {}
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
