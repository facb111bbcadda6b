"""Nodes, placements and the free-capacity view of a cluster.

`ClusterState` is the one place that knows which GPU has how much free memory. It is a value the
scheduler reads: the control loop builds it from the store (`ClusterState.build`), the simulator
keeps one up to date with `allocate`/`release` as jobs start and end, and a cycle works on a
`copy()` so its input is never touched. Memory is kept in integer MiB so that releasing exactly
what was allocated gives back exactly the free state before (no float drift).

Free whole GPUs per node are also indexed in buckets (`buckets[pool][k]` = nodes with exactly k
whole free GPUs), so a best-fit single-node placement is found without scanning every node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence


def gb_to_mib(gb: float) -> int:
    """GB as people write them (in configs, the API, traces) to the MiB the engine counts in.

    Called once, at the edge where a GB figure enters (`trainyard.spec.models`, the API, trace loaders):
    nothing inside a cycle converts, so a value cannot be rounded twice along the way."""
    return int(round(gb * 1024))


@dataclass(frozen=True, slots=True)
class Node:
    """One machine: its GPUs (all of one model and memory size), its topology labels, and the
    features jobs may ask for (`-C/--constraint`, `sched/constraints.py`)."""

    name: str
    gpus: int
    gpu_mem_mib: int = 81920  # MiB per GPU (80 GB)
    pool: str = "default"
    gpu_model: str = "gpu"
    block: str = ""
    rack: str = ""
    healthy: bool = True
    features: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a job runs: for each node index, the GPU indices it holds, and the MiB per GPU.

    `mem_mib` is what the job takes on each of its GPUs: the whole GPU's memory for a whole-GPU
    request, or the requested amount when it shares.
    """

    nodes: tuple[tuple[int, tuple[int, ...]], ...]
    mem_mib: tuple[int, ...]  # per node entry (nodes of one pool may differ in GPU size)
    gpus: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", sum(len(g) for _, g in self.nodes))

    @property
    def node_indices(self) -> tuple[int, ...]:
        return tuple(n for n, _ in self.nodes)


class ClusterState:
    """Free GPUs and GPU memory of every node, consistent with a set of running placements."""

    __slots__ = ("nodes", "free_mib", "cap_mib", "free_whole", "buckets", "pool_free", "max_gpus")

    def __init__(self, nodes: Sequence[Node]):
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.cap_mib: list[int] = [n.gpu_mem_mib for n in self.nodes]
        self.free_mib: list[list[int]] = [[c] * n.gpus for c, n in zip(self.cap_mib, self.nodes)]
        self.free_whole: list[int] = [n.gpus for n in self.nodes]
        self.max_gpus: dict[str, int] = {}
        for n in self.nodes:
            self.max_gpus[n.pool] = max(self.max_gpus.get(n.pool, 0), n.gpus)
        self.buckets: dict[str, list[set[int]]] = {p: [set() for _ in range(m + 1)] for p, m in self.max_gpus.items()}
        self.pool_free: dict[str, int] = {p: 0 for p in self.max_gpus}
        for i, n in enumerate(self.nodes):
            if n.healthy:
                self.buckets[n.pool][n.gpus].add(i)
                self.pool_free[n.pool] += n.gpus

    @classmethod
    def build(cls, nodes: Sequence[Node], placements: Iterable[Placement]) -> "ClusterState":
        state = cls(nodes)
        for p in placements:
            state.allocate(p)
        return state

    def copy(self) -> "ClusterState":
        new = object.__new__(ClusterState)
        new.nodes = self.nodes
        new.cap_mib = self.cap_mib
        new.max_gpus = self.max_gpus
        new.free_mib = [list(f) for f in self.free_mib]
        new.free_whole = list(self.free_whole)
        new.buckets = {p: [set(b) for b in bs] for p, bs in self.buckets.items()}
        new.pool_free = dict(self.pool_free)
        return new

    # -- changes --------------------------------------------------------------------------------

    def _set_whole(self, i: int, whole: int) -> None:
        old = self.free_whole[i]
        if old == whole:
            return
        node = self.nodes[i]
        if node.healthy:
            b = self.buckets[node.pool]
            b[old].discard(i)
            b[whole].add(i)
            self.pool_free[node.pool] += whole - old
        self.free_whole[i] = whole

    def allocate(self, p: Placement) -> None:
        for (i, gis), mem in zip(p.nodes, p.mem_mib):
            free = self.free_mib[i]
            cap = self.cap_mib[i]
            whole = self.free_whole[i]
            for g in gis:
                if free[g] < mem:
                    raise ValueError(f"over-allocation of GPU {g} on node {self.nodes[i].name}")
                if free[g] == cap:
                    whole -= 1
                free[g] -= mem
            self._set_whole(i, whole)

    def release(self, p: Placement) -> None:
        for (i, gis), mem in zip(p.nodes, p.mem_mib):
            free = self.free_mib[i]
            cap = self.cap_mib[i]
            whole = self.free_whole[i]
            for g in gis:
                free[g] += mem
                if free[g] > cap:
                    raise ValueError(f"release of memory never allocated on node {self.nodes[i].name}")
                if free[g] == cap:
                    whole += 1
            self._set_whole(i, whole)

    def take_gpu(self, i: int, g: int) -> None:
        """Make one GPU unusable for the rest of a cycle (reserved for another job's placement)."""
        free = self.free_mib[i]
        if free[g] == self.cap_mib[i]:
            self._set_whole(i, self.free_whole[i] - 1)
        free[g] = 0

    def set_health(self, i: int, healthy: bool) -> None:
        """Mark a node (un)healthy: an unhealthy node takes no new work and counts as no capacity."""
        node = self.nodes[i]
        if node.healthy == healthy:
            return
        whole = self.free_whole[i]
        b = self.buckets[node.pool]
        if healthy:
            b[whole].add(i)
            self.pool_free[node.pool] += whole
        else:
            b[whole].discard(i)
            self.pool_free[node.pool] -= whole
        nodes = list(self.nodes)
        nodes[i] = Node(**{**{s: getattr(node, s) for s in Node.__slots__}, "healthy": healthy})
        self.nodes = tuple(nodes)

    # -- reading --------------------------------------------------------------------------------

    def total_gpus(self, pool: str | None = None) -> int:
        return sum(n.gpus for n in self.nodes if n.healthy and (pool is None or n.pool == pool))

    def free_gpus(self, pool: str) -> int:
        """Whole free GPUs in a pool (healthy nodes only)."""
        return self.pool_free.get(pool, 0)

    def usable_on_node(self, i: int, mem_mib: int | None) -> int:
        """How many GPUs of node i could take a request of `mem_mib` (None: a whole GPU)."""
        if mem_mib is None:
            return self.free_whole[i]
        return sum(1 for f in self.free_mib[i] if f >= mem_mib)
