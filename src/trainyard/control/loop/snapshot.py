"""From the store's rows to the engine's `Snapshot`, and the engine's placements back to rows.

This is the one seam between the control plane and the pure scheduler (design rule 1): the
same `TrainyardPolicy.cycle()` that the simulator replays traces with decides here.

Units: GPU memory is MiB on both sides (the store's `gpu_mem_mib`, the engine's `gpu_mem_mib` on
requests and nodes), passed through as is; GB exists only where people write or read it (the API,
the config, converted once there). Job ids are the store's ints on both sides, passed through too.
A job's wall-time limit is the run-time estimate the engine backfills with, as in Slurm.
"""

from __future__ import annotations

import math
from operator import itemgetter
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

from trainyard.contracts import RankPlacement, ranks_of, slurm_node_order
from trainyard.control.loop import suspects
from trainyard.sched.cluster import ClusterState, Node, Placement
from trainyard.sched.constraints import where_of
from trainyard.sched.types import JobRequest, PendingJob, RunningJob, Snapshot
from trainyard.services.config import ConfigVersion
from trainyard.store.models import ENGINE_COLUMNS, REQUEST_FIELDS, JobRow, NodeRow

USAGE_HALF_LIFE_S = 7 * 86400.0  # fair share forgets usage with Slurm's default PriorityDecayHalfLife


@dataclass(frozen=True)
class NodeIndex:
    """Node names ↔ the engine's node indices, for one configuration version."""

    nodes: tuple[Node, ...]
    index: dict[str, int]

    @classmethod
    def build(cls, cfg: ConfigVersion, states: dict[str, NodeRow], unhealthy: Iterable[str] = ()) -> "NodeIndex":
        bad = set(unhealthy)
        nodes = []
        for n in cfg.nodes:
            st = states.get(n.name)
            # a suspect node (slow in two jobs) takes no new work until its speed check passes
            ok = (st is None or st.state == "up") and n.name not in bad and not suspects.held(cfg, st)
            nodes.append(Node(n.name, n.gpus, n.gpu_mem_mib, n.pool, n.gpu_model, n.block, n.rack, healthy=ok,
                              features=n.features))
        return cls(tuple(nodes), {n.name: i for i, n in enumerate(nodes)})

    def _named(self, p: Placement) -> list[tuple[str, tuple[int, ...], int]]:
        """The placement's parts as (node name, GPU indices, MiB per GPU) in Slurm's node order
        (`contracts.slurm_node_order`: by name, numbers by value), whatever order the engine chose
        them in: the first node (where a batch script runs, and `scontrol show hostnames | head -n 1`
        finds the rendezvous host) and the ranks' block layout are then the ones Slurm gives the
        same allocation."""
        parts = sorted(zip(p.nodes, p.mem_mib), key=lambda part: slurm_node_order(self.nodes[part[0][0]].name))
        return [(self.nodes[i].name, g, m) for (i, g), m in parts]

    def to_rows(self, p: Placement) -> list[dict[str, Any]]:
        """The placement as the store keeps it (`jobs.placement`, `attempts.placement`): one row per node."""
        return [{"node": name, "gpus": list(g), "mem_mib": m} for name, g, m in self._named(p)]

    def ranks(self, p: Placement, tasks_per_node: int | None) -> list[RankPlacement]:
        """The placement's ranks, by the rule the stored rows are read back with (`contracts.ranks_of`)."""
        return ranks_of(((name, g) for name, g, _ in self._named(p)), tasks_per_node)

    def from_rows(self, rows: Sequence[dict[str, Any]]) -> Placement | None:
        try:
            parts = tuple((self.index[r["node"]], tuple(r["gpus"])) for r in rows)
        except KeyError:
            return None  # a node that the configuration no longer has
        return Placement(parts, tuple(int(r["mem_mib"]) for r in rows))


def request_of(j: JobRow) -> JobRequest:
    """`j` is a job row, or any object with its columns as attributes (a plain SQL row). The columns
    marked `engine()` in `store.models` pass as they are (`REQUEST_FIELDS`); the rest are derived
    here: the total GPUs of a gang at its minimum size, the nodes to avoid as a set, and the
    engine's `submit_time`, which is the job's eligible time (`JobRow.eligible_time`) when it has one,
    and its placement constraints as one `Where` (None for most jobs: `sched/constraints.py`)."""
    gpn = j.gpus_per_node
    return JobRequest(
        id=j.id, submit_time=j.submit_time if j.eligible_time is None else j.eligible_time,
        gpus=j.gpus if gpn is None else gpn * j.nodes_min, avoid=frozenset(j.avoid_nodes or ()),
        where=where_of(j.constraint, j.gpu_model, j.nodelist, j.exclude_nodes, bool(j.exclusive)),
        **{field: getattr(j, column) for column, field in _AS_IS},
    )


_AS_IS = tuple(REQUEST_FIELDS.items())


def pending_of(j: JobRow) -> PendingJob:
    return PendingJob(request_of(j), j.attempt, j.queued_since, j.progress_s, j.attained_gpu_s, j.held)


def running_of(j: JobRow, idx: NodeIndex, starting: bool = False) -> RunningJob | None:
    p = idx.from_rows(j.placement or [])
    if p is None or j.start_time is None:
        return None
    return RunningJob(request_of(j), p, j.start_time, j.last_checkpoint or j.start_time, j.attempt,
                      j.progress_s, j.attained_gpu_s, preempting=j.stop_kind is not None, starting=starting)


def decayed_usage(spans: Iterable[tuple[str, int, float, float | None]], now: float,
                  half_life_s: float = USAGE_HALF_LIFE_S) -> dict[str, float]:
    """Each team's GPU-seconds, each second weighted by 2^(-age/half-life) (Slurm's fair-share usage).

    `spans` are (team, GPUs, start, end or None while running), one per attempt.
    """
    lam = math.log(2) / half_life_s
    out: dict[str, float] = {}
    for team, gpus, start, end in spans:
        end = now if end is None else min(end, now)
        if end <= start:
            continue
        # integral of exp(-lam (now - t)) dt from start to end
        w = (math.exp(-lam * (now - end)) - math.exp(-lam * (now - start))) / lam
        out[team] = out.get(team, 0.0) + gpus * w
    return out


# The columns `pending_of` reads: a waiting job whose values of these (and of the lists, made
# tuples to be hashed) are unchanged since the last pass gets the same `PendingJob` back (`PendingCache`).
LIST_COLUMNS = ("avoid_nodes", "nodelist", "exclude_nodes")
PENDING_KEY = tuple(c for c in ENGINE_COLUMNS if c not in LIST_COLUMNS)


class PendingCache:
    """The `PendingJob`s of the last pass, reused for waiting jobs whose rows did not change.

    With thousands waiting, building them (two frozen dataclasses per job, from SQL rows whose
    attribute access costs half a microsecond a column) was the largest part of a control-loop
    pass, and most waiting jobs are the same from one pass to the next. `columns` names the rows'
    columns in order (plain SQL rows, read by position); entries are keyed by every column
    `pending_of` reads, so a changed row is rebuilt, and only the current pass's jobs are kept."""

    def __init__(self, columns: Sequence[str]) -> None:
        self._key = itemgetter(*(columns.index(c) for c in PENDING_KEY))
        self._lists = tuple(columns.index(c) for c in LIST_COLUMNS)
        self._last: dict[tuple, PendingJob] = {}

    def __call__(self, rows: Iterable[Any]) -> list[PendingJob]:  # plain SQL rows (schedule._waiting_rows)
        last, new, out, key_of, lists = self._last, {}, [], self._key, self._lists
        for j in rows:
            key = (key_of(j), *(tuple(j[i]) if j[i] else () for i in lists))
            p = last.get(key)
            if p is None:
                p = pending_of(j)
            new[key] = p
            out.append(p)
        self._last = new
        return out


def build_snapshot(cfg: ConfigVersion, idx: NodeIndex, running_rows: Sequence[JobRow], pending_rows: Sequence[Any],
                   usage: dict[str, float], now: float, cache: PendingCache, explain: bool = True,
                   stopped_for: dict[int, int] | None = None,
                   launching: frozenset[tuple[int, int]] = frozenset(),
                   data_on: Mapping[int, tuple[tuple[str, int], ...]] | None = None) -> Snapshot:
    """`launching`: (job, attempt) of the attempts still being launched (control/loop/launch_threads.py).
    `data_on`: job -> the nodes holding its datasets, with their bytes (`JobRequest.data_on`: a tie-break)."""
    teams, classes = cfg.sched
    running = [r for r in (running_of(j, idx, (j.id, j.attempt) in launching) for j in running_rows) if r is not None]
    cluster = ClusterState.build(idx.nodes, [r.placement for r in running])
    pending = cache(j for j in pending_rows if not j.held and j.job_class in classes and j.team in teams)
    if data_on:
        pending = [replace(p, req=replace(p.req, data_on=data_on[p.req.id])) if p.req.id in data_on else p
                   for p in pending]
    return Snapshot(now=now, cluster=cluster, teams=teams, classes=classes, running=running, pending=pending,
                    usage=usage, explain=explain, stopped_for=stopped_for or {}, reservations=cfg.reservations)
