"""Prometheus metrics of the control plane, computed from the store at each scrape.

Counting from the store rather than incrementing in-process counters keeps the numbers right
across `yard up` restarts and with several readers: a scrape is a few GROUP BY queries. Names
follow Prometheus conventions (`_total` counters, base units: seconds).

What is exported:
- cluster: `trainyard_gpus{pool,state}` (state total, allocated, idle), `trainyard_nodes{pool,state}`
  (up, drain, down), `trainyard_gpu_utilization_ratio{node,gpu}` (NVML, where the control plane
  runs on a GPU machine; empty elsewhere);
- queue: `trainyard_queue_length{team,class}` (jobs waiting), `trainyard_queue_wait_seconds{team,class}`
  (histogram: submit or requeue → start, per attempt), `trainyard_jobs{team,state}`;
- failures and their cost: `trainyard_attempts_ended_total{team,cause}`,
  `trainyard_job_failures_total{team,reason}` (oom, node, user, hang, crash),
  `trainyard_preemptions_total{team}`, `trainyard_lost_gpu_seconds_total{team,cause}`,
  `trainyard_recovery_seconds{team}` (histogram: an attempt's end → the next one's first step),
  `trainyard_job_retries_total{team}`;
- running jobs: `trainyard_job_checkpoint_age_seconds{job,team}` (since the last checkpoint, or
  the start when it has none).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session, aliased

from trainyard.services.config import ConfigVersion
from trainyard.states import PENDING_STATES
from trainyard.services.nodes import list_nodes
from trainyard.store.models import AttemptRow, JobRow

if TYPE_CHECKING:
    from trainyard.control.plane import ControlPlane

RECOVERY_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
WAIT_BUCKETS = (1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 86400.0, 3 * 86400.0)
# attempt causes that are failures, by the reason label dashboards group them under
FAILURE_REASONS = {"oom": "oom", "node_lost": "node", "user_error": "user", "hung": "hang", "crash": "crash"}


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


class PlaneCollector(Collector):
    """A prometheus_client collector reading the control plane's store and configuration, found
    at each scrape through `plane_of()` (some tests build the app without a plane)."""

    def __init__(self, plane_of: Callable[[], ControlPlane]) -> None:
        self.plane_of = plane_of

    def collect(self) -> Iterator[Metric]:
        cp = self.plane_of()
        with cp.store.session() as s:
            yield from self._cluster(s, cp.configs.current(s))
            yield from self._queue(s)
            yield from self._attempts(s)
            yield from self._recovery(s)
            yield from self._jobs(s)
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

    def _queue(self, s: Session) -> Iterator[Metric]:
        length = GaugeMetricFamily("trainyard_queue_length", "Jobs waiting to (re)start.", labels=["team", "class"])
        q = (select(JobRow.team, JobRow.job_class, func.count()).where(JobRow.state.in_(PENDING_STATES))
             .group_by(JobRow.team, JobRow.job_class))
        for team, cls, n in s.execute(q):
            length.add_metric([team, cls], n)
        yield length
        prev = aliased(AttemptRow)
        q = (select(JobRow.team, JobRow.job_class, AttemptRow.started_at - func.coalesce(prev.ended_at, JobRow.submit_time))
             .select_from(AttemptRow)
             .join(JobRow, JobRow.id == AttemptRow.job_id)
             .outerjoin(prev, and_(prev.job_id == AttemptRow.job_id, prev.attempt == AttemptRow.attempt - 1)))
        waits: dict[tuple[str, str], list[float]] = {}
        for team, cls, seconds in s.execute(q):
            waits.setdefault((team, cls), []).append(max(0.0, float(seconds or 0.0)))
        h = HistogramMetricFamily("trainyard_queue_wait_seconds",
                                  "Wait of each started attempt: from submit (or the previous attempt's end) to start.",
                                  labels=["team", "class"])
        for (team, cls), values in sorted(waits.items()):
            h.add_metric([team, cls], histogram_buckets(values, WAIT_BUCKETS), sum_value=sum(values))
        yield h

    def _attempts(self, s: Session) -> Iterator[Metric]:
        ended = CounterMetricFamily("trainyard_attempts_ended", "Ended job attempts, by why they ended.",
                                    labels=["team", "cause"])
        lost = CounterMetricFamily("trainyard_lost_gpu_seconds",
                                   "GPU-seconds of work since the last checkpoint thrown away when attempts ended.",
                                   labels=["team", "cause"])
        q = (select(JobRow.team, AttemptRow.cause, func.count(), func.coalesce(func.sum(AttemptRow.lost_gpu_s), 0.0))
             .select_from(AttemptRow)
             .join(JobRow, JobRow.id == AttemptRow.job_id)
             .where(AttemptRow.ended_at.is_not(None))
             .group_by(JobRow.team, AttemptRow.cause))
        failures = CounterMetricFamily("trainyard_job_failures", "Failed attempts by reason (oom, node, user, hang, "
                                       "crash).", labels=["team", "reason"])
        preemptions = CounterMetricFamily("trainyard_preemptions", "Attempts ended by preemption.", labels=["team"])
        for team, cause, n, gpu_s in s.execute(q):
            ended.add_metric([team, cause or "unknown"], n)
            lost.add_metric([team, cause or "unknown"], float(gpu_s))
            if cause in FAILURE_REASONS:
                failures.add_metric([team, FAILURE_REASONS[cause]], n)
            elif cause == "preempted":
                preemptions.add_metric([team], n)
        yield ended
        yield lost
        yield failures
        yield preemptions

    def _recovery(self, s: Session) -> Iterator[Metric]:
        nxt = aliased(AttemptRow)
        q = (select(JobRow.team, nxt.first_step_at - AttemptRow.ended_at)
             .select_from(AttemptRow)
             .join(JobRow, JobRow.id == AttemptRow.job_id)
             .join(nxt, and_(nxt.job_id == AttemptRow.job_id, nxt.attempt == AttemptRow.attempt + 1))
             .where(AttemptRow.ended_at.is_not(None), nxt.first_step_at.is_not(None)))
        by_team: dict[str, list[float]] = {}
        for team, seconds in s.execute(q):
            by_team.setdefault(team, []).append(max(0.0, float(seconds)))
        h = HistogramMetricFamily("trainyard_recovery_seconds",
                                  "From an attempt's end to the next attempt's first finished step.", labels=["team"])
        for team, values in sorted(by_team.items()):
            h.add_metric([team], histogram_buckets(values, RECOVERY_BUCKETS), sum_value=sum(values))
        yield h

    def _jobs(self, s: Session) -> Iterator[Metric]:
        retries = CounterMetricFamily("trainyard_job_retries", "Automatic retries of jobs after failures.",
                                      labels=["team"])
        states = GaugeMetricFamily("trainyard_jobs", "Jobs by state.", labels=["team", "state"])
        q = select(JobRow.team, JobRow.state, func.count(), func.coalesce(func.sum(JobRow.retries), 0)) \
            .group_by(JobRow.team, JobRow.state)
        per_team: dict[str, int] = {}
        for team, state, n, r in s.execute(q):
            states.add_metric([team, state], n)
            per_team[team] = per_team.get(team, 0) + int(r)
        for team, r in sorted(per_team.items()):
            retries.add_metric([team], r)
        yield retries
        yield states
        age = GaugeMetricFamily("trainyard_job_checkpoint_age_seconds",
                                "Running jobs: time since the last checkpoint (or since the start, without one).",
                                labels=["job", "team"])
        now = time.time()
        q = select(JobRow.id, JobRow.team, JobRow.start_time, JobRow.last_checkpoint).where(JobRow.state == "RUNNING")
        for jid, team, start, ckpt in s.execute(q):
            since = max(x for x in (start, ckpt) if x is not None) if (start or ckpt) else now
            age.add_metric([str(jid), team], max(0.0, now - since))
        yield age


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
