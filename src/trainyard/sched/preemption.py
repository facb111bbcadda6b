"""Choosing victims: the set of running jobs whose preemption makes room at the least lost work.

Who may be a victim is the engine's call (`engine.TrainyardPolicy._victim_kind`): lower priority,
or borrowing beyond quota, preemptible, past its min run time, not already leaving. This module
only answers: given those candidates, which ones to stop so that the job fits, losing the fewest
GPU-seconds of work since their last checkpoints?

Per node, candidates are taken cheapest first (lost work per GPU they free there) until enough
GPUs are usable; the job then goes to the cheapest node, or for a gang to the cheapest set of
nodes. A GPU shared by several jobs frees only when all of them go. What each team may lose is
the caller's `Tally` (`budget.py`): the victims already chosen, and the rule for adding more.
"""

from __future__ import annotations

from typing import Callable, Mapping

from trainyard.sched.budget import Tally
from trainyard.sched.cluster import ClusterState
from trainyard.sched.types import JobId, JobRequest, RunningJob


def _node_option(state: ClusterState, i: int, need: int, mem: int | None, cands: list[RunningJob],
                 lost: Callable[[RunningJob], float], base: Tally) -> tuple[float, list[RunningJob]] | None:
    free = list(state.free_mib[i])
    cap = state.cap_mib[i]
    want = cap if mem is None else mem

    def usable() -> int:
        return sum(1 for f in free if f >= want)

    if usable() >= need:
        return 0.0, []
    tally = base.copy()
    chosen: list[RunningJob] = []
    cost = 0.0
    ordered = sorted(cands, key=lambda r: (lost(r) / max(1, r.gpus), r.req.id))
    for r in ordered:
        if not tally.take(r):
            continue
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
                 lost: Callable[[RunningJob], float], base: Tally,
                 max_options: int = 64) -> list[RunningJob] | None:
    """Victims whose leaving lets `req` fit on `n_nodes` nodes with `per_node` GPUs each, or None.

    `node_jobs` lists the running jobs on each node, `ok(job)` says who may be a victim,
    `lost(job)` the GPU-seconds it would lose if stopped now, and `base` the victims already
    chosen with the budget they count against (not modified). Nodes are examined most-free first
    and the search stops once `max_options` (at least 4 per node wanted) viable nodes are found:
    the cheapest victims among those, not a global optimum, to keep a cycle within milliseconds.
    """
    where = req.where
    whole = where is not None and where.exclusive
    mem = None if whole else req.gpu_mem_mib
    options: list[tuple[float, int, int, list[RunningJob]]] = []
    want = max(max_options, 4 * n_nodes)
    if mem is None:
        order = [i for free, members in reversed(list(enumerate(state.buckets.get(req.pool, ()))))
                 for i in sorted(members)]
    else:
        order = sorted((i for i, nd in enumerate(state.nodes) if nd.pool == req.pool and nd.healthy),
                       key=lambda i: (-state.usable_on_node(i, mem), i))
    banned: frozenset[int] = frozenset()
    required: list[int] = []
    if where is not None:  # only nodes it may use (constraints.py); those it must include first
        banned = where.banned(state.nodes)
        required = where.required(state.nodes)
        skip = banned | set(required)
        order = required + [i for i in order if i not in skip]
        if len(required) > n_nodes:
            return None
    for i in order:
        node = state.nodes[i]
        if node.gpus < per_node or (mem is not None and state.cap_mib[i] < mem):
            continue
        need = node.gpus if whole else per_node  # an exclusive job needs the whole node
        usable = state.usable_on_node(i, mem)
        cands = [r for r in node_jobs.get(i, ()) if ok(r)] if usable < need else []
        if usable < need:
            on_here = sum(len(g) for r in cands for n, g in r.placement.nodes if n == i)
            if usable + on_here < need:
                continue
        opt = _node_option(state, i, need, mem, cands, lost, base)
        if opt is not None:
            options.append((opt[0], len(opt[1]), i, opt[1]))
            if len(options) >= want:
                break
    if len(options) < n_nodes:
        return None
    options.sort(key=lambda o: (o[0], o[1], o[2]))
    if required:  # the nodes it must include, whatever they cost, then the cheapest others
        must = set(required)
        if len({o[2] for o in options if o[2] in must}) < len(must):
            return None
        options = [o for o in options if o[2] in must] + [o for o in options if o[2] not in must]
    victims: dict[JobId, RunningJob] = {}
    for _, _, _, vs in options[:n_nodes]:
        for v in vs:
            victims[v.req.id] = v
    tally = base.copy()
    for v in sorted(victims.values(), key=lambda r: r.req.id):
        if not tally.take(v):
            return None
    if not victims:
        return None
    return sorted(victims.values(), key=lambda r: r.req.id)
