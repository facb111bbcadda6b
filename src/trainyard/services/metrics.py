"""Prometheus metrics of the control plane, computed from the store at each scrape.

Counting from the store rather than incrementing in-process counters keeps the numbers right
across `yard up` restarts and with several readers: a scrape is a few GROUP BY queries. Names
follow Prometheus conventions (`_total` counters, base units: seconds).

What is exported:
- cluster: `trainyard_gpus{pool,state}` (state total, allocated, idle), `trainyard_nodes{pool,state}`
  (up, drain, down), `trainyard_gpu_utilization_ratio{node,gpu}` (NVML, where the control plane
  runs on a GPU machine; empty elsewhere);
- teams and quotas (Kueue's per-queue gauges): `trainyard_team_gpus_allocated{team,pool}` (GPUs
  its running attempts hold), `trainyard_team_gpus_borrowed{team,pool}` (held beyond nominal),
  `trainyard_team_quota_nominal_gpus{team,pool}`, `trainyard_team_quota_borrowing_limit_gpus`
  and `trainyard_team_quota_lending_limit_gpus` (only where a limit is set: none means unlimited);
  each class's `trainyard_class_max_wait_seconds{class}` (what the queue-wait alert compares with);
- disk per team (control/lifecycle/storage.py): `trainyard_team_storage_bytes{team}`,
  `trainyard_team_storage_quota_bytes{team}` (where set), `trainyard_team_storage_over_quota{team}`,
  `trainyard_storage_free_bytes{path}` and `trainyard_storage_reserve_bytes{path}` (the data dir's
  file system, and `jobs/`'s when it is another); beyond the job dirs (issue 41),
  `trainyard_team_archive_bytes{team}` (its checkpoints in the archive tier) and
  `trainyard_team_dataset_cache_bytes{team}` (its datasets' copies in the node caches);
- usage: `trainyard_gpu_seconds_total{team,user,class}` (GPU-seconds allocated to attempts,
  running ones up to the scrape: what `yard acct` and `yard report` count in GPU-hours,
  services/accounting.py; in seconds because Prometheus names base units, and `promtool check
  metrics` refuses an `_hours_total`); `trainyard_goodput_gpu_seconds_total{team,bucket}` (the
  goodput ledger of the attempts that ended, docs/accounting.md: a running attempt's live split
  may move seconds from one bucket to another as it goes on, and a counter never goes down);
- queue: `trainyard_queue_length{team,class}` (jobs waiting), `trainyard_queue_wait_seconds{team,class}`
  (histogram: each started attempt's wait, as the accounting defines it: from eligibility, or the
  previous attempt's end), `trainyard_jobs{team,state}`;
- failures and their cost: `trainyard_attempts_ended_total{team,cause}`,
  `trainyard_job_failures_total{team,reason}` (oom, node, user, hang, crash),
  `trainyard_preemptions_total{team}`, `trainyard_lost_gpu_seconds_total{team,cause}`,
  `trainyard_recovery_seconds{team}` (histogram: an attempt's end → the next one's first step),
  `trainyard_job_retries_total{team}`;
- start-time estimates (services/estimates.py): `trainyard_start_estimate_error_seconds{class}`
  (histogram: |actual start − first estimated start| of each attempt that waited with an estimate)
  and `trainyard_start_estimate_late_total{class}` (those that started over a minute late);
- running jobs: `trainyard_job_checkpoint_age_seconds{job_id,team}` (since the last checkpoint, or
  the start when it has none). The label is `job_id`: Prometheus's own target label is `job`, and
  a scrape renamed ours to `exported_job`;
- the plane itself (this process's counts): `trainyard_loop_pass_seconds` (a summary: quantiles of
  the recent passes), `trainyard_loop_last_pass_timestamp_seconds` (when the newest pass ended,
  unix time), `trainyard_loop_slow_passes_total`, `trainyard_thread_restarts_total{thread}`,
  `trainyard_thread_alive{thread}`, `trainyard_data_disk_free_bytes`,
  `trainyard_api_refused_total` (503s under overload, api/app.py).

The counters and histograms counted from jobs and attempts (`CARRIED`) never go down when
retention purges old jobs: what the purged rows added is kept in `usage_carry` and added back
(`counted` computes the samples of any set of jobs, for the purge and for the scrape alike).
"""

from __future__ import annotations

import json
import socket
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client.core import (
    CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric, SummaryMetricFamily,
)
from prometheus_client.registry import Collector
from sqlalchemy import ColumnElement, and_, case, func, select
from sqlalchemy.orm import Session, aliased

from trainyard.contracts import LEDGER_BUCKETS
from trainyard.disk import free_bytes
from trainyard.services.accounting import wait_base
from trainyard.services.config import ConfigVersion
from trainyard.sim.result import LATE_AFTER_S
from trainyard.states import PENDING_STATES
from trainyard.services.nodes import list_nodes
from trainyard.services import storage_view
from trainyard.store.models import AttemptRow, EstimateOutcomeRow, JobRow, UsageCarryRow

if TYPE_CHECKING:
    from trainyard.services.plane_facade import Plane

RECOVERY_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
ESTIMATE_ERROR_BUCKETS = (60.0, 300.0, 900.0, 1800.0, 3600.0, 2 * 3600.0, 4 * 3600.0, 12 * 3600.0, 86400.0,
                          3 * 86400.0, 7 * 86400.0)
WAIT_BUCKETS = (1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 86400.0, 3 * 86400.0)
# attempt causes that are failures, by the reason label dashboards group them under
FAILURE_REASONS = {"oom": "oom", "pids": "pids", "node_lost": "node", "user_error": "user", "hung": "hang",
                   "crash": "crash", "exit_code": "exit", "signal": "signal", "requeue_exit": "requeue_exit"}

# The families counted from jobs and their attempts, whose samples survive a purge (`usage_carry`):
# name → (help, labels) for counters, (help, labels, bucket bounds) for histograms.
COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "trainyard_attempts_ended": ("Ended job attempts, by why they ended.", ("team", "cause")),
    "trainyard_lost_gpu_seconds": ("GPU-seconds of work since the last checkpoint thrown away when attempts ended.",
                                   ("team", "cause")),
    "trainyard_job_failures": ("Failed attempts by reason (oom, pids, node, user, hang, crash, exit, signal, "
                                "requeue_exit).", ("team", "reason")),
    "trainyard_preemptions": ("Attempts ended by preemption.", ("team",)),
    "trainyard_job_retries": ("Automatic retries of jobs after failures.", ("team",)),
    "trainyard_gpu_seconds": ("GPU-seconds allocated to job attempts (running ones up to now).",
                              ("team", "user", "class")),
    "trainyard_goodput_gpu_seconds": ("GPU-seconds of ended job attempts by goodput ledger bucket.",
                                      ("team", "bucket")),
    "trainyard_start_estimate_late": ("Attempts that started more than a minute after their first estimated start.",
                                      ("class",)),
}
HISTOGRAMS: dict[str, tuple[str, tuple[str, ...], tuple[float, ...]]] = {
    "trainyard_queue_wait_seconds": ("Wait of each started attempt: from eligibility (or the previous attempt's end) "
                                     "to its start.", ("team", "class"), WAIT_BUCKETS),
    "trainyard_recovery_seconds": ("From an attempt's end to the next attempt's first finished step.", ("team",),
                                   RECOVERY_BUCKETS),
    "trainyard_start_estimate_error_seconds": ("|actual start - first estimated start| of each attempt that waited "
                                               "with an estimate.", ("class",), ESTIMATE_ERROR_BUCKETS),
}
CARRIED = tuple(COUNTERS) + tuple(HISTOGRAMS)

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]  # (sample name, sorted labels) → value
_Seconds = TypeVar("_Seconds", bound=float | None)  # a histogram's SQL value (NULL where a time is unknown)


def histogram_buckets(values: list[float], bounds: tuple[float, ...]) -> list[tuple[str, float]]:
    """Cumulative (le, count) pairs, +Inf last, as Prometheus histograms are exposed."""
    out, values = [], sorted(values)
    i = 0
    for b in bounds:
        while i < len(values) and values[i] <= b:
            i += 1
        out.append((repr(float(b)), float(i)))
    out.append(("+Inf", float(len(values))))
    return out


def _labels(**kv: str) -> Labels:
    return tuple(sorted((k, str(v)) for k, v in kv.items()))


def _add(out: Samples, name: str, labels: Labels, value: float) -> None:
    key = (name, labels)
    out[key] = out.get(key, 0.0) + float(value)


def _histogram(out: Samples, name: str, bounds: tuple[float, ...], q: Any, label_names: tuple[str, ...],
               value: ColumnElement[_Seconds], s: Session) -> None:
    """Bucket counts, count and sum of `value` per label set, added up in SQL (no row per attempt)."""
    v = case((value < 0, 0.0), else_=value)
    cols = [func.sum(case((v <= b, 1), else_=0)) for b in bounds]
    for row in s.execute(q.add_columns(func.count(), func.coalesce(func.sum(v), 0.0), *cols)):
        labels = _labels(**dict(zip(label_names, row[:len(label_names)])))
        n, total, *cum = row[len(label_names):]
        for b, c in zip(bounds, cum):
            _add(out, f"{name}_bucket", tuple(sorted(labels + (("le", repr(float(b))),))), c or 0)
        _add(out, f"{name}_bucket", tuple(sorted(labels + (("le", "+Inf"),))), n)
        _add(out, f"{name}_count", labels, n)
        _add(out, f"{name}_sum", labels, total)


def counted(s: Session, now: float, jobs: Sequence[int] | None = None) -> Samples:
    """The samples of the `CARRIED` families that the given jobs (None: every job in the store)
    add: the scrape counts them all, retention the jobs it is about to purge."""
    out: Samples = {}

    def only(q: Any) -> Any:
        return q if jobs is None else q.where(JobRow.id.in_(list(jobs)))

    q = only(select(JobRow.team, AttemptRow.cause, func.count(), func.coalesce(func.sum(AttemptRow.lost_gpu_s), 0.0))
             .select_from(AttemptRow).join(JobRow, JobRow.id == AttemptRow.job_id)
             .where(AttemptRow.ended_at.is_not(None)).group_by(JobRow.team, AttemptRow.cause))
    for team, cause, n, gpu_s in s.execute(q):
        _add(out, "trainyard_attempts_ended_total", _labels(team=team, cause=cause or "unknown"), n)
        _add(out, "trainyard_lost_gpu_seconds_total", _labels(team=team, cause=cause or "unknown"), gpu_s)
        if cause in FAILURE_REASONS:
            _add(out, "trainyard_job_failures_total", _labels(team=team, reason=FAILURE_REASONS[cause]), n)
        elif cause == "preempted":
            _add(out, "trainyard_preemptions_total", _labels(team=team), n)
    q = only(select(JobRow.team, func.coalesce(func.sum(JobRow.retries), 0)).group_by(JobRow.team))
    for team, r in s.execute(q):
        _add(out, "trainyard_job_retries_total", _labels(team=team), r)
    held = func.coalesce(AttemptRow.ended_at, now) - AttemptRow.started_at
    q = only(select(JobRow.team, JobRow.user, JobRow.job_class,
                    func.coalesce(func.sum(AttemptRow.gpus * case((held > 0, held), else_=0.0)), 0.0))
             .select_from(AttemptRow).join(JobRow, JobRow.id == AttemptRow.job_id)
             .group_by(JobRow.team, JobRow.user, JobRow.job_class))
    for team, user, cls, gpu_s in s.execute(q):
        _add(out, "trainyard_gpu_seconds_total", _labels(team=team, user=user, **{"class": cls}), gpu_s)
    q = only(select(JobRow.team, *(func.coalesce(func.sum(AttemptRow.ledger[b].as_float()), 0.0)
                                   for b in LEDGER_BUCKETS))
             .select_from(AttemptRow).join(JobRow, JobRow.id == AttemptRow.job_id)
             .where(AttemptRow.ended_at.is_not(None), AttemptRow.ledger.is_not(None)).group_by(JobRow.team))
    for team, *by_bucket in s.execute(q):
        for b, gpu_s in zip(LEDGER_BUCKETS, by_bucket):
            _add(out, "trainyard_goodput_gpu_seconds_total", _labels(team=team, bucket=b), gpu_s)
    prev = aliased(AttemptRow)
    q = only(select(JobRow.team, JobRow.job_class).select_from(AttemptRow)
             .join(JobRow, JobRow.id == AttemptRow.job_id)
             .outerjoin(prev, and_(prev.job_id == AttemptRow.job_id, prev.attempt == AttemptRow.attempt - 1))
             .group_by(JobRow.team, JobRow.job_class))
    _histogram(out, "trainyard_queue_wait_seconds", WAIT_BUCKETS, q, ("team", "class"),
               AttemptRow.started_at - wait_base(prev.ended_at), s)
    nxt = aliased(AttemptRow)
    q = only(select(JobRow.team).select_from(AttemptRow).join(JobRow, JobRow.id == AttemptRow.job_id)
             .join(nxt, and_(nxt.job_id == AttemptRow.job_id, nxt.attempt == AttemptRow.attempt + 1))
             .where(AttemptRow.ended_at.is_not(None), nxt.first_step_at.is_not(None)).group_by(JobRow.team))
    _histogram(out, "trainyard_recovery_seconds", RECOVERY_BUCKETS, q, ("team",), nxt.first_step_at - AttemptRow.ended_at,
               s)
    _estimate_errors(out, s, jobs)
    return out


def _estimate_errors(out: Samples, s: Session, jobs: Sequence[int] | None) -> None:
    """The start-estimate families (services/estimates.py): each outcome's absolute error, late starts."""
    t = EstimateOutcomeRow
    q = select(t.job_class).group_by(t.job_class)
    if jobs is not None:
        q = q.where(t.job_id.in_(list(jobs)))
    _histogram(out, "trainyard_start_estimate_error_seconds", ESTIMATE_ERROR_BUCKETS, q, ("class",),
               func.abs(t.error_s), s)
    late = q.add_columns(func.sum(case((t.error_s > LATE_AFTER_S, 1), else_=0)))
    for cls, n in s.execute(late):
        _add(out, "trainyard_start_estimate_late_total", _labels(**{"class": cls}), n or 0)


def carried(s: Session) -> Samples:
    """What purged rows added to the `CARRIED` families (`usage_carry`)."""
    return {(name, tuple(tuple(x) for x in json.loads(labels))): value
            for name, labels, value in s.execute(select(UsageCarryRow.name, UsageCarryRow.labels, UsageCarryRow.value))}


def carry_key(labels: Labels) -> str:
    return json.dumps([list(x) for x in labels])


def families(samples: Samples) -> Iterator[Metric]:
    """The `CARRIED` families from their samples, every family present (empty ones too)."""
    by_family: dict[str, dict[tuple[str, Labels], float]] = defaultdict(dict)
    for (name, labels), v in samples.items():
        fam = next((f for f in CARRIED if name.startswith(f) and name[len(f):] in ("_total", "_bucket", "_count", "_sum")),
                   None)
        if fam is not None:
            by_family[fam][(name, labels)] = v
    for fam, (doc, names) in COUNTERS.items():
        c = CounterMetricFamily(fam, doc, labels=list(names))
        for (_, labels), v in sorted(by_family[fam].items()):
            d = dict(labels)
            c.add_metric([d[n] for n in names], v)
        yield c
    for fam, (doc, names, bounds) in HISTOGRAMS.items():
        h = HistogramMetricFamily(fam, doc, labels=list(names))
        sets: dict[Labels, dict[str, float]] = defaultdict(dict)
        for (name, labels), v in by_family[fam].items():
            d = dict(labels)
            le = d.pop("le", None)
            key = tuple(sorted(d.items()))
            sets[key][name[len(fam):] + (f":{le}" if le else "")] = v
        for labels, vals in sorted(sets.items()):
            d = dict(labels)
            buckets = [(repr(float(b)), vals.get(f"_bucket:{repr(float(b))}", 0.0)) for b in bounds]
            buckets.append(("+Inf", vals.get("_bucket:+Inf", 0.0)))
            h.add_metric([d[n] for n in names], buckets, sum_value=vals.get("_sum", 0.0))
        yield h


class PlaneCollector(Collector):
    """A prometheus_client collector reading the control plane's store and configuration, found
    at each scrape through `plane_of()` (some tests build the app without a plane)."""

    def __init__(self, plane_of: Callable[[], Plane]) -> None:
        self.plane_of = plane_of

    def collect(self) -> Iterator[Metric]:
        cp = self.plane_of()
        with cp.store.session() as s:
            cfg = cp.configs.current(s)
            yield from self._cluster(s, cfg)
            yield from self._teams(s, cfg)
            yield _classes(cfg)
            yield from self._queue(s)
            samples = counted(s, cp.clock())
            for key, v in carried(s).items():
                samples[key] = samples.get(key, 0.0) + v
            yield from families(samples)
            yield from self._jobs(s)
            yield from _tiers(s, cfg.spec)
            spec = cfg.spec
        yield from _storage(cp, spec)
        yield from _plane_itself(cp)
        yield _gpu_utilization()

    def _cluster(self, s: Session, cfg: ConfigVersion) -> Iterator[Metric]:
        gpus = GaugeMetricFamily("trainyard_gpus", "GPUs per pool: total, allocated to jobs, idle.",
                                 labels=["pool", "state"])
        nodes = GaugeMetricFamily("trainyard_nodes", "Nodes per pool by state (up, suspect, drain, down, remediating).",
                                  labels=["pool", "state"])
        per_pool: dict[str, list[int]] = {}
        per_state: dict[tuple[str, str], int] = {}
        for n in list_nodes(s, cfg):
            total_used = per_pool.setdefault(n["pool"], [0, 0])
            total_used[0] += n["gpus"]
            total_used[1] += n["gpus_used"]
            key = (n["pool"], n["state"])
            per_state[key] = per_state.get(key, 0) + 1
        for pool, (total, used) in sorted(per_pool.items()):
            gpus.add_metric([pool, "total"], total)
            gpus.add_metric([pool, "allocated"], used)
            gpus.add_metric([pool, "idle"], total - used)
            for state in ("up", "suspect", "drain", "down", "remediating"):
                nodes.add_metric([pool, state], per_state.get((pool, state), 0))
        yield gpus
        yield nodes

    def _teams(self, s: Session, cfg: ConfigVersion) -> Iterator[Metric]:
        """GPUs each team holds per pool, and its quota there (Kueue's cluster-queue gauges)."""
        labels = ["team", "pool"]
        alloc = GaugeMetricFamily("trainyard_team_gpus_allocated", "GPUs a team's running attempts hold, per pool.",
                                  labels=labels)
        borrowed = GaugeMetricFamily("trainyard_team_gpus_borrowed", "GPUs a team holds beyond its nominal quota.",
                                     labels=labels)
        nominal = GaugeMetricFamily("trainyard_team_quota_nominal_gpus", "A team's nominal quota per pool.",
                                    labels=labels)
        borrow_limit = GaugeMetricFamily("trainyard_team_quota_borrowing_limit_gpus",
                                         "A team's borrowing limit per pool (absent: unlimited).", labels=labels)
        lend_limit = GaugeMetricFamily("trainyard_team_quota_lending_limit_gpus",
                                       "A team's lending limit per pool (absent: unlimited).", labels=labels)
        held: dict[tuple[str, str], int] = {}
        q = (select(JobRow.team, JobRow.pool, func.coalesce(func.sum(AttemptRow.gpus), 0))
             .select_from(AttemptRow).join(JobRow, JobRow.id == AttemptRow.job_id)
             .where(AttemptRow.ended_at.is_(None)).group_by(JobRow.team, JobRow.pool))
        for team, pool, g in s.execute(q):
            held[(team, pool)] = int(g)
        quotas = {(t.name, p): q for t in cfg.spec.teams for p, q in t.quotas.items()}
        for key in sorted(set(held) | set(quotas)):
            used, quota = held.get(key, 0), quotas.get(key)
            alloc.add_metric(list(key), used)
            borrowed.add_metric(list(key), max(0, used - (quota.nominal if quota else 0)))
            if quota is not None:
                nominal.add_metric(list(key), quota.nominal)
                if quota.borrowing_limit is not None:
                    borrow_limit.add_metric(list(key), quota.borrowing_limit)
                if quota.lending_limit is not None:
                    lend_limit.add_metric(list(key), quota.lending_limit)
        yield from (alloc, borrowed, nominal, borrow_limit, lend_limit)

    def _queue(self, s: Session) -> Iterator[Metric]:
        length = GaugeMetricFamily("trainyard_queue_length", "Jobs waiting to (re)start.", labels=["team", "class"])
        q = (select(JobRow.team, JobRow.job_class, func.count()).where(JobRow.state.in_(PENDING_STATES))
             .group_by(JobRow.team, JobRow.job_class))
        for team, cls, n in s.execute(q):
            length.add_metric([team, cls], n)
        yield length

    def _jobs(self, s: Session) -> Iterator[Metric]:
        states = GaugeMetricFamily("trainyard_jobs", "Jobs by state.", labels=["team", "state"])
        by_state = select(JobRow.team, JobRow.state, func.count()).group_by(JobRow.team, JobRow.state)
        for team, state, n in s.execute(by_state):
            states.add_metric([team, state], n)
        yield states
        age = GaugeMetricFamily("trainyard_job_checkpoint_age_seconds",
                                "Running jobs: time since the last checkpoint (or since the start, without one).",
                                labels=["job_id", "team"])
        now = time.time()
        running = (select(JobRow.id, JobRow.team, JobRow.start_time, JobRow.last_checkpoint)
                   .where(JobRow.state == "RUNNING"))
        for jid, team, start, ckpt in s.execute(running):
            since = max(x for x in (start, ckpt) if x is not None) if (start or ckpt) else now
            age.add_metric([str(jid), team], max(0.0, now - since))
        yield age


def _storage(cp: Plane, spec: Any) -> Iterator[Metric]:
    """Disk per team, as the storage meter last measured it (control/lifecycle/storage.py), and the reserve."""
    rep = cp.storage_report(spec)
    used = GaugeMetricFamily("trainyard_team_storage_bytes", "Bytes a team's job dirs hold (allocated blocks, as last "
                             "measured; dirs no job owns under team=\"\").", labels=["team"])
    quota = GaugeMetricFamily("trainyard_team_storage_quota_bytes", "A team's storage quota (only where one is set).",
                              labels=["team"])
    over = GaugeMetricFamily("trainyard_team_storage_over_quota", "1 while a team is over its storage quota (its new "
                             "attempts wait: StorageQuota).", labels=["team"])
    kinds = GaugeMetricFamily("trainyard_team_storage_kind_bytes", "Apparent bytes of a team's job dirs per kind "
                              "(checkpoints, logs, metrics, other; issue 41), as last measured.", labels=["team", "kind"])
    for row in rep["teams"]:
        team = row["team"] or ""
        for kind, n in row.get("kinds", {}).items():
            kinds.add_metric([team, kind], n)
        used.add_metric([team], row["bytes"])
        over.add_metric([team], 1.0 if row["over"] else 0.0)
        if row["quota_bytes"] is not None:
            quota.add_metric([team], row["quota_bytes"])
    free = GaugeMetricFamily("trainyard_storage_free_bytes", "Free space on the data dir's file system and on jobs/'s "
                             "when it is another.", labels=["path"])
    reserve = GaugeMetricFamily("trainyard_storage_reserve_bytes", "Free space kept for the store and the plane: under "
                                "it no new attempt starts (DiskReserve).", labels=["path"])
    for fs in rep["file_systems"]:
        free.add_metric([fs["path"]], fs["free"])
        reserve.add_metric([fs["path"]], fs["reserve"])
    yield from (used, quota, over, kinds, free, reserve)


def _tiers(s: Session, spec: Any) -> Iterator[Metric]:
    """The archive tier and the node dataset caches per team, from their records (`yard storage`'s
    figures: services/storage_view.tiers): what a team holds beyond its job dirs' quota."""
    archive, cached = storage_view.tiers(s, spec)
    arch = GaugeMetricFamily("trainyard_team_archive_bytes", "Bytes the archive tier holds of a team's jobs' "
                             "checkpoints (verified copies, with their sums and markers; issue 41).", labels=["team"])
    cache = GaugeMetricFamily("trainyard_team_dataset_cache_bytes", "Bytes of a team's datasets staged in the nodes' "
                              "caches, every node's copy counted (team=\"\": a dataset in no catalogue).",
                              labels=["team"])
    for team, row in sorted(archive.items()):
        arch.add_metric([team], row["bytes"])
    for team, row in sorted(cached.items()):
        cache.add_metric([team], row["bytes"])
    yield from (arch, cache)


def _classes(cfg: ConfigVersion) -> Metric:
    """Each class's max_wait as configured now: what an alert on a class's queue wait compares with
    (deploy/prometheus: TrainyardQueueWaitAboveMaxWait), so the rules carry no copy of it."""
    g = GaugeMetricFamily("trainyard_class_max_wait_seconds", "A job class's max_wait (the wait after which its jobs "
                          "take precedence), as configured now.", labels=["class"])
    for c in cfg.spec.classes:
        g.add_metric([c.name], float(c.max_wait))
    return g


def _plane_itself(cp: Any) -> Iterator[Metric]:
    """The plane's own state, from this process (it restarts with it): loop passes, supervised
    threads, the data disk. (API refusals under overload: `trainyard_api_refused_total`, by the
    app's own collector.) `cp` is the `ControlPlane` behind the `Plane`: its loop's stats, its
    threads and its notifier are its own, not what services ask of it."""
    st = cp.loop.stats
    xs = sorted(st.recent_pass_s)
    passes = SummaryMetricFamily("trainyard_loop_pass_seconds", "Control-loop pass time: quantiles over the recent "
                                 "passes, count and sum over all since the plane started.", labels=[])
    if xs:
        # prometheus_client's family takes no quantiles: they are added as the samples they are
        passes.add_metric([], count_value=st.passes, sum_value=st.total_pass_s)
        for q in (0.5, 0.99, 1.0):
            passes.add_sample("trainyard_loop_pass_seconds", {"quantile": str(q)}, xs[min(len(xs) - 1, int(q * len(xs)))])
    yield passes
    yield CounterMetricFamily("trainyard_loop_slow_passes", "Control-loop passes over their time budget.",
                              value=st.slow_passes)
    # the newest pass's end as a unix time (the stats keep it on the monotonic clock): an alert takes
    # `time() - it` as the loop's pass age, which a counter's changes() sees only minutes late
    last = GaugeMetricFamily("trainyard_loop_last_pass_timestamp_seconds", "Unix time the control loop's newest "
                             "pass ended (absent until the first pass ends).", labels=[])
    if st.last_pass_at is not None:
        last.add_metric([], time.time() - (time.monotonic() - st.last_pass_at))
    yield last
    restarts = CounterMetricFamily("trainyard_thread_restarts", "Supervised background threads restarted after "
                                   "dying (control/lifecycle/supervise.py).", labels=["thread"])
    alive = GaugeMetricFamily("trainyard_thread_alive", "1 while a supervised background thread runs.",
                              labels=["thread"])
    for th in cp.threads:
        restarts.add_metric([th.name], th.stats.restarts)
        alive.add_metric([th.name], 1.0 if th.alive else 0.0)
    yield restarts
    yield alive
    notifier = getattr(cp, "notifier", None)
    if notifier is not None:  # --mail-type's webhook (control/lifecycle/notify.py)
        sent = CounterMetricFamily("trainyard_notifications", "Webhook notifications (--mail-type) by result: sent, "
                                   "failed (every try), retried (tries after the first), dropped (queue full).",
                                   labels=["result"])
        for result in ("sent", "failed", "retried", "dropped"):
            sent.add_metric([result], getattr(notifier.stats, result))
        yield sent
    try:
        free = float(free_bytes(cp.data_dir))
    except OSError:
        return
    yield GaugeMetricFamily("trainyard_data_disk_free_bytes", "Free space on the data dir's file system.", value=free)


def _gpu_utilization() -> Metric:
    """NVML's utilization of this machine's GPUs (the control plane's own host), when it has any."""
    g = GaugeMetricFamily("trainyard_gpu_utilization_ratio", "GPU busy fraction (NVML), where measurable.",
                          labels=["node", "gpu"])
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no GPU: the family stays empty
        return g
    try:
        host = socket.gethostname()
        for i in range(pynvml.nvmlDeviceGetCount()):
            util = pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(i))
            g.add_metric([host, str(i)], util.gpu / 100.0)
    except Exception:  # noqa: BLE001
        pass
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return g
