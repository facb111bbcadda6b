"""Prometheus metrics of the control plane, computed from the store at each scrape.

Counting from the store rather than incrementing in-process counters keeps the numbers right
across `yard up` restarts and with several readers: a scrape is a few GROUP BY queries. Names
follow Prometheus conventions (`_total` counters, base units: seconds).

What is exported (issue 5's accounting; issue 7 adds the cluster and queue series):
- `trainyard_attempts_ended_total{team,cause}`: ended attempts by why they ended;
- `trainyard_lost_gpu_seconds_total{team,cause}`: work since the last checkpoint thrown away;
- `trainyard_recovery_seconds{team}`: histogram, an attempt's end to the next one's first step;
- `trainyard_job_retries_total{team}`: automatic retries after failures;
- `trainyard_jobs{team,state}`: jobs by state now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session, aliased

from trainyard.store.db import Store
from trainyard.store.models import AttemptRow, JobRow

RECOVERY_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


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
    """A prometheus_client collector reading a store, found at each scrape through `store_of()`
    (the app is built before its control plane has opened the store in some tests)."""

    def __init__(self, store_of: Callable[[], Store]) -> None:
        self.store_of = store_of

    def collect(self) -> Iterator[Metric]:
        with self.store_of().session() as s:
            yield from self._attempts(s)
            yield from self._recovery(s)
            yield from self._jobs(s)

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
        for team, cause, n, gpu_s in s.execute(q):
            ended.add_metric([team, cause or "unknown"], n)
            lost.add_metric([team, cause or "unknown"], float(gpu_s))
        yield ended
        yield lost

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
