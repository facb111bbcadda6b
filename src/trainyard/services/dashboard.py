"""What the web dashboard shows, as plain data: the cluster map, the queue, a job's page.

Every read goes through the same service functions the REST API calls, with the caller's
`Principal`, so the dashboard can never show more than the API would: job listings come from
`jobs.list_job_dicts` (private columns blanked for other teams), a job from `jobs.get`, its logs
only past `jobs.readable_logs`. Nothing here checks a role by itself.

The loss curve is read from the job's `metrics/metrics.jsonl` (rank 0, written by the runtime;
see `trainyard.runtime.metrics`): the last line logged for each step, as the runtime's own
reader takes it, without importing the runtime (it pulls in torch). The job writes that file, so
it is read through `jobfs` and bounded: a file over CURVE_BUDGET bytes is sampled in windows
spread over the whole run (a page load of an 800 MB file took 10 s and 790 MB before). Utilization
and wait over time are in `dashboard_history`.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from trainyard import figures, jobfs
from trainyard.contracts import JobDir
from trainyard.services import dashboard_history, events, goodput_report, jobs, nodes
from trainyard.services.auth import Principal
from trainyard.services.config import ConfigVersion
from trainyard.services.errors import Forbidden
from trainyard.states import ACTIVE_STATES, PENDING_STATES
from trainyard.services import telemetry  # the job page's GPU plots (issue 39)

QUEUE_ROWS = 50  # rows shown per team and class; the rest are counted
LOG_TAIL_BYTES = 64 * 1024
CURVE_BUDGET = 8 << 20  # bytes of metrics.jsonl read for one loss curve, however big the file
MAX_CURVE_POINTS = 2000  # a longer run is drawn with every k-th step (and its last)
NODE_STATES = ("up", "suspect", "drain", "down", "remediating")


@dataclass
class GpuCell:
    index: int
    jobs: list[dict[str, Any]] = field(default_factory=list)  # id, name, team, user, class of the jobs on it

    @property
    def job(self) -> dict[str, Any] | None:
        """The (first) job holding it; jobs asking for GPU memory (`--gpu-mem`) may share a GPU."""
        return self.jobs[0] if self.jobs else None


@dataclass
class NodeCard:
    name: str
    pool: str
    state: str
    reason: str
    gpu_model: str
    gpu_mem_gb: float
    block: str | None
    rack: str | None
    gpus: list[GpuCell]

    @property
    def used(self) -> int:
        return sum(1 for g in self.gpus if g.job is not None)


def team_order(cfg: ConfigVersion) -> list[str]:
    """Teams in configuration order: the index picks a team's colour on the map."""
    return [t.name for t in cfg.spec.teams]


def cluster_map(s: Session, cfg: ConfigVersion, by: Principal) -> list[NodeCard]:
    """Every node of the configuration with its health state and, per GPU, the job holding it."""
    holders: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for j in jobs.list_job_dicts(s, by, states=list(ACTIVE_STATES),
                                 fields=["id", "name", "team", "user", "class", "placement"]):
        for part in j["placement"] or []:
            for g in part["gpus"]:
                holders.setdefault((part["node"], g), []).append(j)
    cards = []
    for n in nodes.list_nodes(s, cfg):
        cards.append(NodeCard(n["name"], n["pool"], n["state"], n["reason"], n["gpu_model"], n["gpu_mem_gb"],
                              n["block"], n["rack"],
                              [GpuCell(i, holders.get((n["name"], i), [])) for i in range(n["gpus"])]))
    return cards


@dataclass
class QueueGroup:
    team: str
    job_class: str
    priority: int
    jobs: list[dict[str, Any]] = field(default_factory=list)
    more: int = 0  # waiting jobs not listed (over QUEUE_ROWS)


def queue(s: Session, cfg: ConfigVersion, by: Principal, limit: int = QUEUE_ROWS) -> list[QueueGroup]:
    """Waiting jobs grouped by team (configuration order) and class (highest priority first),
    each group in the order of its estimated starts (jobs without an estimate last, by id)."""
    order = {t: i for i, t in enumerate(team_order(cfg))}
    prio = {c.name: c.priority for c in cfg.spec.classes}
    groups: dict[tuple[str, str], QueueGroup] = {}
    for j in jobs.list_job_dicts(s, by, states=list(PENDING_STATES)):
        key = (j["team"], j["class"])
        g = groups.get(key) or groups.setdefault(key, QueueGroup(j["team"], j["class"], prio.get(j["class"], 0)))
        g.jobs.append(j)
    out = sorted(groups.values(), key=lambda g: (order.get(g.team, len(order)), g.team, -g.priority, g.job_class))
    for g in out:
        g.jobs.sort(key=lambda j: (j["est_start"] is None, j["est_start"] or 0.0, j["id"]))
        g.more, g.jobs = max(0, len(g.jobs) - limit), g.jobs[:limit]
    return out


def running(s: Session, by: Principal) -> list[dict[str, Any]]:
    """Running and completing jobs, oldest start first."""
    out = jobs.list_job_dicts(s, by, states=list(ACTIVE_STATES))
    return sorted(out, key=lambda j: (j["start_time"] or 0.0, j["id"]))


def summary(cards: list[NodeCard], groups: list[QueueGroup], active: list[dict[str, Any]]) -> dict[str, Any]:
    """The header line: GPUs by use, nodes by state, jobs running and waiting."""
    total = sum(len(c.gpus) for c in cards)
    used = sum(c.used for c in cards)
    by_state = {st: sum(1 for c in cards if c.state == st) for st in NODE_STATES}
    by_state.update({c.state: by_state.get(c.state, 0) for c in cards if c.state not in by_state})
    return {"gpus": total, "gpus_used": used, "gpus_idle": total - used, "nodes": len(cards),
            "nodes_by_state": {k: v for k, v in by_state.items() if v},
            "running": len(active), "waiting": sum(len(g.jobs) + g.more for g in groups)}


def overview(s: Session, cfg: ConfigVersion, by: Principal, now: float, window_s: float) -> dict[str, Any]:
    """Everything the overview page shows, as the template names it, but the charts' drawing:
    the map, the queue, what runs, the header line, the teams' colours, the last 20 events, and
    `history` (allocation and wait over the last `window_s`, for the API to draw)."""
    cards, groups, active, teams = cluster_map(s, cfg, by), queue(s, cfg, by), running(s, by), team_order(cfg)
    return {"who": by, "now": now, "cards": cards, "groups": groups, "running": active,
            "summary": summary(cards, groups, active), "config_version": cfg.version,
            "team_class": {t: f"t{i % 8}" for i, t in enumerate(teams)}, "teams": teams,
            "history": dashboard_history.history(s, cfg, now, window_s),
            "events": events.list_events(s, limit=20, newest=True)[::-1]}


# --- one job --------------------------------------------------------------------------------------


@dataclass
class LossCurve:
    steps: list[int]  # the steps drawn, ascending
    values: list[float]  # their loss
    total_steps: int  # steps with a finite loss (drawn or not)
    non_finite: list[int]  # steps whose loss is no number to draw (`figures.finite`: NaN, ±inf, huge, text)
    resumes: list[int]  # steps an attempt resumed from (`{"event": "resume"}` lines)


def loss_curve(job_dir: Path, key: str = "loss", max_points: int = MAX_CURVE_POINTS) -> LossCurve:
    """The job's loss per step from its metrics.jsonl: the last line logged for each step (a resumed
    attempt logs again the steps its predecessor did after its last checkpoint). Empty when the job
    writes no step metrics (it does not use the runtime)."""
    last: dict[int, Any] = {}
    resumes: list[int] = []
    jd = JobDir(job_dir)
    for line in jobfs.Tree(jd.root).sample_lines(jd.metrics_file, CURVE_BUDGET):
        try:
            r = json.loads(line)
        except ValueError:  # a line cut by a kill -9
            continue
        if not isinstance(r, dict) or (at := figures.step(r.get("step"))) is None:
            continue  # no step, or one no chart can place (a bool, negative, beyond 2**62)
        if "event" in r:
            if r["event"] == "resume":
                resumes.append(at)
        elif key in r:
            last[at] = r[key]
    finite, bad = [], []
    for step in sorted(last):
        v = figures.finite(last[step])
        if v is not None:
            finite.append((step, v))
        else:  # NaN, ±inf ("nan", "inf": the runtime writes them as strings), beyond ±1e300, null, text
            bad.append(step)
    drawn = finite
    if len(finite) > max_points:
        k = math.ceil(len(finite) / max_points)
        drawn = finite[::k] + ([finite[-1]] if (len(finite) - 1) % k else [])
    return LossCurve([x for x, _ in drawn], [y for _, y in drawn], len(finite), bad, sorted(set(resumes)))


@dataclass
class LogView:
    allowed: bool
    why: str = ""  # the refusal, when not allowed
    rank: int = 0
    ranks: list[int] = field(default_factory=list)  # ranks that have a log
    text: str = ""  # the end of the rank's log
    cut: bool = False  # the log is longer than what is shown


def job_logs(s: Session, data_dir: Path, job_id: int, by: Principal, rank: int = 0) -> LogView:
    """The end of a rank's log, if `by` may read the job's logs (`jobs.readable_logs` decides)."""
    try:
        row = jobs.readable_logs(s, job_id, by)
    except Forbidden as e:
        return LogView(False, e.message, rank)
    jd = jobs.job_dir(data_dir, row)
    tree = jobfs.Tree(jd.root)  # the job's owner writes the logs: no link, no FIFO, a bounded tail
    ranks = sorted(int(n[5:-4]) for n, _ in tree.list_dir(jd.logs)
                   if n.startswith("rank-") and n.endswith(".log") and n[5:-4].isascii() and n[5:-4].isdigit())
    text, cut = "", False
    try:
        chunk = tree.read_range(jd.rank_log(rank), -LOG_TAIL_BYTES, LOG_TAIL_BYTES)
        text, cut = chunk.data.decode("utf-8", "replace"), chunk.offset > 0
    except OSError:
        pass
    if cut:
        text = text.split("\n", 1)[-1]  # the first line is cut
    return LogView(True, "", rank, ranks, text, cut)


def job_page(s: Session, data_dir: Path, job_id: int, by: Principal, rank: int = 0, *, spec: Any = None,
             now: float | None = None) -> dict[str, Any]:
    """Everything the job page shows; `jobs.get` decides whether `by` may see the job at all.
    `spec` and `now`: the classes' idle thresholds and the time a running attempt's ledger is split at."""
    row = jobs.get(s, job_id, by)
    when = time.time() if now is None else now
    return {
        "goodput": goodput_report.job_goodput(s, data_dir, spec, job_id, by, when).model_dump(),
        "job": jobs.job_dict(row, by),
        "attempts": jobs.attempts(s, job_id),
        "events": events.list_events(s, job_id=job_id, limit=500, newest=True),
        "loss": loss_curve(jobs.job_dir(data_dir, row).root),
        "logs": job_logs(s, data_dir, job_id, by, rank),
        "gpus": telemetry.series(s, job_id),  # per-GPU telemetry, plotted on the page
    }
