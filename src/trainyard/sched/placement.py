"""Gang placement: all of a job's GPUs at once, or nothing, with topology and memory in mind.

Rules, in the order they are applied:
1. Memory: a GPU is usable for a job only if its free memory covers the job's `gpu_mem_mib`; a job
   without `gpu_mem_mib` needs whole, untouched GPUs. Shared requests prefer GPUs already in use
   (best fit), so whole GPUs stay whole for jobs that need them.
2. Packing: a single-node job goes to the node whose free GPUs fit it most tightly (best fit),
   which keeps large holes free for large jobs.
3. Topology: a multi-node job is put inside one block (and one rack) when any can hold it,
   choosing the tightest such domain; otherwise it spans as few blocks as possible.
4. Suspects: nodes in the job's `avoid` set (where an earlier attempt hung or crashed) are used
   only when the job fits nowhere else right now: a preference, so no job waits on it forever.
5. Constraints (`req.where`, `sched/constraints.py`): nodes of another GPU model, without the
   features asked for or excluded are never used (a rule, unlike `avoid`); nodes the job must
   include are taken first; an exclusive job takes only nodes nothing uses, and every GPU of them.
6. Data (issue 41): among choices the rules above find equal (the same fit, the same topology),
   nodes that hold more bytes of the job's datasets (`req.data_on`) come first, so that a job
   finds its data staged. Only a tie-break: it never changes how many GPUs, blocks or racks a
   placement takes, nor whether the job fits.

`place` returns the placement, or None with the reason it failed (capacity, topology or memory).
It never modifies the state; callers `allocate` what they decide to keep.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from trainyard.sched.cluster import ClusterState, Placement
from trainyard.sched.types import JobRequest, Reason


def _held(state: ClusterState, req: JobRequest) -> dict[int, int]:
    """Node index -> bytes of the job's datasets it holds (rule 6)."""
    if not req.data_on:
        return {}
    by_name = dict(req.data_on)
    return {i: by_name[n.name] for i, n in enumerate(state.nodes) if n.name in by_name}


def place(state: ClusterState, req: JobRequest, n_nodes: int | None = None) -> tuple[Placement | None, Reason | None]:
    """Find a placement for `req` (at `n_nodes` nodes for a node-shaped, possibly elastic job)."""
    where = req.where
    banned = frozenset() if where is None else where.banned(state.nodes)
    special = where is not None and (where.include or where.exclusive)
    if req.avoid:
        avoid = frozenset(i for i, n in enumerate(state.nodes) if n.name in req.avoid)
        if avoid:
            found = (_place_where(state, req, n_nodes, banned | avoid) if special
                     else _place(state, req, n_nodes, banned | avoid))
            if found[0] is not None:
                return found
    if special:
        return _place_where(state, req, n_nodes, banned)
    return _place(state, req, n_nodes, banned)


def _place(state: ClusterState, req: JobRequest, n_nodes: int | None,
           avoid: frozenset[int]) -> tuple[Placement | None, Reason | None]:
    pool = req.pool
    max_node = state.max_gpus.get(pool, 0)
    if req.where is not None and avoid:  # the largest node it may use, not the pool's
        max_node = max((n.gpus for i, n in enumerate(state.nodes) if n.pool == pool and i not in avoid), default=0)
    mem = req.gpu_mem_mib
    if req.gpus_per_node is not None:
        gpn = req.gpus_per_node
        n = n_nodes if n_nodes is not None else req.min_nodes
        if gpn > max_node:
            return None, Reason.TOPOLOGY
        need = gpn * n
    else:
        need = req.gpus
        gpn = None
        n = -(-need // max_node) if max_node else 1
    if max_node == 0:
        return None, Reason.CAPACITY
    if mem is not None and not _any_gpu_big_enough(state, pool, mem):
        return None, Reason.MEMORY
    if mem is None and state.free_gpus(pool) < need:
        return None, Reason.CAPACITY

    held = _held(state, req)
    if n == 1:
        k = need
        node = _best_single_node(state, pool, k, mem, avoid, held)
        if node is None:
            return None, _why_not(state, pool, need, mem)
        return _take(state, [(node, k)], mem), None

    candidates = _usable_nodes(state, pool, mem, avoid)
    if gpn is not None:
        eligible = [(i, c) for i, c in candidates if c >= gpn]
        chosen = _choose_gang(state, eligible, n, gpn, held)
        if chosen is None:
            return None, _why_not(state, pool, need, mem)
        return _take(state, [(i, gpn) for i in chosen], mem), None
    chosen_counts = _choose_spread(state, candidates, n, need, held)
    if chosen_counts is None:
        return None, _why_not(state, pool, need, mem)
    return _take(state, chosen_counts, mem), None


def _any_gpu_big_enough(state: ClusterState, pool: str, mem: int) -> bool:
    return any(n.pool == pool and n.healthy and c >= mem for n, c in zip(state.nodes, state.cap_mib))


def memory_ever_fits(state: ClusterState, req: JobRequest) -> bool:
    """Whether some healthy GPU of the job's pool is big enough for its `gpu_mem_mib` once empty
    (always true without one): a job waiting for memory that others hold may be reserved for;
    one no GPU could ever hold may not."""
    return req.gpu_mem_mib is None or _any_gpu_big_enough(state, req.pool, req.gpu_mem_mib)


def _why_not(state: ClusterState, pool: str, need: int, mem: int | None) -> Reason:
    if mem is None:
        return Reason.TOPOLOGY if state.free_gpus(pool) >= need else Reason.CAPACITY
    usable = sum(c for _, c in _usable_nodes(state, pool, mem))
    return Reason.TOPOLOGY if usable >= need else Reason.MEMORY


def _best_single_node(state: ClusterState, pool: str, k: int, mem: int | None,
                      avoid: frozenset[int] = frozenset(), held: Mapping[int, int] | None = None) -> int | None:
    held = held or {}
    if mem is None:
        buckets = state.buckets[pool]
        for free in range(k, len(buckets)):
            b = buckets[free] - avoid if avoid else buckets[free]
            if b:
                return min(b, key=lambda i: (-held.get(i, 0), i)) if held else min(b)
        return None
    best, best_key = None, None
    for i, node in enumerate(state.nodes):
        if node.pool != pool or not node.healthy or i in avoid:
            continue
        c = state.usable_on_node(i, mem)
        if c >= k:
            # Tightest fit: fewest usable GPUs left over, then least free memory left over.
            key = (c - k, sum(state.free_mib[i]), -held.get(i, 0), i)
            if best_key is None or key < best_key:
                best, best_key = i, key
    return best


def _usable_nodes(state: ClusterState, pool: str, mem: int | None,
                  avoid: frozenset[int] = frozenset()) -> list[tuple[int, int]]:
    out: list[tuple[int, int]]
    if mem is None:
        out = []
        for free, nodes in enumerate(state.buckets[pool]):
            if free:
                out.extend((i, free) for i in nodes if i not in avoid)
        out.sort()
        return out
    out = []
    for i, node in enumerate(state.nodes):
        if node.pool == pool and node.healthy and i not in avoid:
            c = state.usable_on_node(i, mem)
            if c:
                out.append((i, c))
    return out


def _domains(state: ClusterState, eligible: list[tuple[int, int]], label: str) -> dict[str, list[tuple[int, int]]]:
    groups: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for i, c in eligible:
        groups[getattr(state.nodes[i], label)].append((i, c))
    return groups


def _choose_gang(state: ClusterState, eligible: list[tuple[int, int]], n: int, gpn: int,
                 held: Mapping[int, int] | None = None) -> list[int] | None:
    """n nodes with >= gpn usable GPUs each, in as few blocks, then racks, as possible."""
    if len(eligible) < n:
        return None
    held = held or {}
    blocks = _domains(state, eligible, "block")
    fitting = [(len(v), b) for b, v in blocks.items() if len(v) >= n]
    if fitting:
        _, b = min(fitting)
        picked = _choose_in_block(state, blocks[b], n, held)
        if held:  # rule 6: a block as tight, as few racks, more of the job's data
            shape = (len(blocks[b]), _racks(state, picked))
            for size, other in sorted(fitting):
                if size == shape[0] and other != b and _data(held, blocks[other]) > _data(held, blocks[b]):
                    alt = _choose_in_block(state, blocks[other], n, held)
                    if _racks(state, alt) == shape[1] and _data(held, [(i, 0) for i in alt]) > \
                            _data(held, [(i, 0) for i in picked]):
                        b, picked = other, alt
        return picked
    chosen: list[int] = []
    for _, b in sorted(((-len(v), b) for b, v in blocks.items())):
        chosen.extend(_choose_in_block(state, blocks[b], min(n - len(chosen), len(blocks[b])), held))
        if len(chosen) == n:
            return chosen
    return None


def _racks(state: ClusterState, chosen: list[int]) -> int:
    return len({(state.nodes[i].block, state.nodes[i].rack) for i in chosen})


def _data(held: Mapping[int, int], members: list[tuple[int, int]]) -> int:
    return sum(held.get(i, 0) for i, _ in members) if held else 0


def _choose_in_block(state: ClusterState, members: list[tuple[int, int]], n: int,
                     held: Mapping[int, int] | None = None) -> list[int]:
    held = held or {}
    racks = _domains(state, members, "rack")
    fitting = [(len(v), -_data(held, v), r) for r, v in racks.items() if len(v) >= n]
    order = [min(fitting)[2]] if fitting else [r for _, r in sorted((-len(v), r) for r, v in racks.items())]
    chosen: list[int] = []
    for r in order:
        # Tightest nodes first, so nodes with many free GPUs stay whole; then those holding its data.
        for i, _ in sorted(racks[r], key=lambda ic: (ic[1], -held.get(ic[0], 0), ic[0])):
            chosen.append(i)
            if len(chosen) == n:
                return chosen
    return chosen


def _choose_spread(state: ClusterState, candidates: list[tuple[int, int]], n: int, need: int,
                   held: Mapping[int, int] | None = None) -> list[tuple[int, int]] | None:
    """`need` GPUs on at most n nodes (the fewest the job could use), inside one block if possible."""
    held = held or {}
    blocks = _domains(state, candidates, "block")
    best: tuple[tuple[int, int, int, str], list[tuple[int, int]]] | None = None
    for b, members in blocks.items():
        top = _with_data(state, sorted(members, key=lambda ic: (-ic[1], ic[0]))[:n], members, held)
        total = sum(c for _, c in top)
        if total >= need:
            key = (len(top), total - need, -_data(held, top), b)
            if best is None or key < best[0]:
                best = (key, top)
    if best is not None:
        top = best[1]
    else:
        top = _with_data(state, sorted(candidates, key=lambda ic: (-ic[1], ic[0]))[:n], candidates, held)
        if sum(c for _, c in top) < need:
            return None
    out, left = [], need
    for i, c in top:
        take = min(c, left)
        if take:
            out.append((i, take))
            left -= take
    return out


def _with_data(state: ClusterState, top: list[tuple[int, int]], members: list[tuple[int, int]],
               held: Mapping[int, int]) -> list[tuple[int, int]]:
    """`top` with each node swapped for one left out that has as many usable GPUs, sits in the
    same block and rack, and holds more of the job's data (rule 6): the same shape, its data nearer."""
    if not held:
        return top
    chosen = {i for i, _ in top}
    spare = sorted((m for m in members if m[0] not in chosen), key=lambda ic: (-held.get(ic[0], 0), ic[0]))
    out = []
    for i, c in top:
        where = (state.nodes[i].block, state.nodes[i].rack)
        alt = next((m for m in spare if m[1] == c and (state.nodes[m[0]].block, state.nodes[m[0]].rack) == where
                    and held.get(m[0], 0) > held.get(i, 0)), None)
        if alt is None:
            out.append((i, c))
        else:
            spare.remove(alt)
            out.append(alt)
    return out


def _take(state: ClusterState, counts: list[tuple[int, int]], mem: int | None) -> Placement:
    nodes, mems = [], []
    for i, k in counts:
        cap = state.cap_mib[i]
        free = state.free_mib[i]
        if mem is None:
            gis = [g for g, f in enumerate(free) if f == cap][:k]
            mems.append(cap)
        else:
            # Best fit per GPU: the fullest GPUs that still fit, so whole GPUs stay whole.
            gis = sorted((g for g, f in enumerate(free) if f >= mem), key=lambda g: (free[g], g))[:k]
            mems.append(mem)
        nodes.append((i, tuple(sorted(gis))))
    return Placement(nodes=tuple(nodes), mem_mib=tuple(mems))


def _place_where(state: ClusterState, req: JobRequest, n_nodes: int | None,
                 banned: frozenset[int]) -> tuple[Placement | None, Reason | None]:
    """Rule 5 for jobs that must include nodes (`-w`) or take whole ones (`--exclusive`).

    The included nodes come first (each with `gpus_per_node` GPUs, or for a GPU-count job at
    least one, as many as it needs); the rest of the job is placed as any other. An exclusive
    job sees only nodes with every GPU untouched, and takes all of them on each node it uses."""
    where = req.where
    assert where is not None
    whole = where.exclusive
    mem = None if whole else req.gpu_mem_mib
    pool = req.pool
    cands: dict[int, int] = {}
    for i, node in enumerate(state.nodes):
        if node.pool != pool or not node.healthy or i in banned:
            continue
        if whole:
            c = node.gpus if state.free_whole[i] == node.gpus else 0
        else:
            c = state.usable_on_node(i, mem)
        if c:
            cands[i] = c
    required = where.required(state.nodes)
    if any(i in banned or state.nodes[i].pool != pool for i in required):
        return None, Reason.TOPOLOGY  # a node it must include it may not use: never fits
    if any(i not in cands for i in required):
        return None, Reason.CAPACITY
    must = set(required)
    rest = [(i, c) for i, c in sorted(cands.items()) if i not in must]
    held = _held(state, req)
    counts: list[tuple[int, int]] = []
    if req.gpus_per_node is not None:
        gpn = req.gpus_per_node
        n = n_nodes if n_nodes is not None else req.min_nodes
        if len(required) > n:
            return None, Reason.TOPOLOGY
        if any(cands[i] < gpn for i in required):
            return None, Reason.CAPACITY
        chosen = list(required)
        if n > len(required):
            more = _choose_gang(state, [(i, c) for i, c in rest if c >= gpn], n - len(required), gpn, held)
            if more is None:
                return None, Reason.CAPACITY
            chosen += more
        counts = [(i, cands[i] if whole else gpn) for i in chosen]
    else:
        left = req.gpus
        if len(required) > left and not whole:
            return None, Reason.TOPOLOGY
        for k, i in enumerate(required):
            take = cands[i] if whole else min(cands[i], left - (len(required) - k - 1))
            counts.append((i, take))
            left -= take
        if left > 0:
            if whole:
                # Best fit on one node, else the largest nodes first, until the GPUs are there.
                one = [(c, i) for i, c in rest if c >= left]
                if one:
                    c, i = min(one)
                    counts.append((i, c))
                    left = 0
                else:
                    for i, c in sorted(rest, key=lambda ic: (-ic[1], ic[0])):
                        counts.append((i, c))
                        left -= c
                        if left <= 0:
                            break
            else:
                top = max((c for _, c in rest), default=0)
                spread = _choose_spread(state, rest, -(-left // top), left, held) if top else None
                if spread is None and rest:
                    spread = _choose_spread(state, rest, len(rest), left, held)
                if spread is not None:
                    counts += spread
                    left = 0
        if left > 0:
            return None, Reason.CAPACITY
    return _take(state, counts, mem), None
