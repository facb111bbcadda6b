"""From the store's rows to the engine's `Snapshot`, and the engine's placements back to rows.

This is the one seam between the control plane and the pure scheduler (DESIGN rule 1): the
same `TrainyardPolicy.cycle()` that the simulator replays traces with decides here.

Units: the store keeps GPU memory in MiB, the engine's requests in GB (as the config writes them).
A job's wall-time limit is the run-time estimate the engine backfills with, as in Slurm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from trainyard.sched.cluster import ClusterState, Node, Placement
from trainyard.sched.types import JobRequest, PendingJob, RunningJob, Snapshot
from trainyard.services.config import ConfigVersion
from trainyard.store.models import JobRow, NodeRow

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
            ok = (st is None or st.state == "up") and n.name not in bad
            nodes.append(Node(n.name, n.gpus, n.gpu_mem, n.pool, n.gpu_model, n.block, n.rack, healthy=ok))
        return cls(tuple(nodes), {n.name: i for i, n in enumerate(nodes)})

    def to_rows(self, p: Placement) -> list[dict[str, Any]]:
        return [{"node": self.nodes[i].name, "gpus": list(g), "mem_mib": m} for (i, g), m in zip(p.nodes, p.mem_mib)]

    def from_rows(self, rows: Sequence[dict[str, Any]]) -> Placement | None:
        try:
            parts = tuple((self.index[r["node"]], tuple(r["gpus"])) for r in rows)
        except KeyError:
            return None  # a node that the configuration no longer has
        return Placement(parts, tuple(int(r["mem_mib"]) for r in rows))


def request_of(j: JobRow) -> JobRequest:
    """`j` is a job row, or any object with its columns as attributes (a plain SQL row)."""
    gpn = j.gpus_per_node
    return JobRequest(
        str(j.id), j.team, j.job_class, j.submit_time,
        gpus=j.gpus if gpn is None else gpn * j.nodes_min, gpus_per_node=gpn,
        min_nodes=j.nodes_min, max_nodes=j.nodes_max,
        gpu_mem=None if j.gpu_mem_mib is None else j.gpu_mem_mib / 1024,
        est_runtime_s=j.time_limit_s, checkpoint_interval_s=j.checkpoint_interval_s, pool=j.pool,
        avoid=frozenset(j.avoid_nodes or ()),
    )


def pending_of(j: JobRow) -> PendingJob:
    return PendingJob(request_of(j), j.attempt, j.queued_since, j.progress_s, j.attained_gpu_s, j.held)


def running_of(j: JobRow, idx: NodeIndex) -> RunningJob | None:
    p = idx.from_rows(j.placement or [])
    if p is None or j.start_time is None:
        return None
    return RunningJob(request_of(j), p, j.start_time, j.last_checkpoint or j.start_time, j.attempt,
                      j.progress_s, j.attained_gpu_s, preempting=j.stop_kind is not None)


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


def build_snapshot(cfg: ConfigVersion, idx: NodeIndex, running_rows: Sequence[JobRow], pending_rows: Sequence[JobRow],
                   usage: dict[str, float], now: float, explain: bool = True) -> Snapshot:
    teams, classes = cfg.sched
    running = [r for r in (running_of(j, idx) for j in running_rows) if r is not None]
    cluster = ClusterState.build(idx.nodes, [r.placement for r in running])
    pending = [pending_of(j) for j in pending_rows if not j.held and j.job_class in classes and j.team in teams]
    return Snapshot(now=now, cluster=cluster, teams=teams, classes=classes, running=running, pending=pending,
                    usage=usage, explain=explain)
