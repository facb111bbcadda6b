"""The dashboard's Usage page over time (`/ui/usage`): each team's GPU-hours per bucket of the period
against its nominal quota, and the cluster's busy % per bucket, from the attempts' rows as the
accounting counts them (services/accounting.py; the period's totals are `usage_report.report`'s).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from trainyard.services.accounting import Window
from trainyard.services.config import ConfigVersion
from trainyard.services.dashboard_history import _mean_over_buckets
from trainyard.store.models import AttemptRow, JobRow

PERIODS = {"24h": 86400.0, "7d": 7 * 86400.0, "30d": 30 * 86400.0, "90d": 90 * 86400.0}
BUCKETS = 30


@dataclass
class UsageHistory:
    start: float
    end: float
    bucket_s: float
    capacity: int  # GPUs configured now
    team_gpu_hours: dict[str, list[float]]  # per bucket
    team_nominal_gpu_hours: dict[str, float]  # a bucket's worth of nominal quota (all pools)
    busy_pct: list[float]

    @property
    def centers(self) -> list[float]:
        return [self.start + (i + 0.5) * self.bucket_s for i in range(len(self.busy_pct))]


def usage_history(s: Session, cfg: ConfigVersion, win: Window, now: float, buckets: int = BUCKETS) -> UsageHistory:
    edges = np.linspace(win.start, win.end, buckets + 1)
    bucket_s = (win.end - win.start) / buckets
    per_team: dict[str, tuple[list[float], list[float], list[float]]] = {}
    q = (select(JobRow.team, AttemptRow.gpus, AttemptRow.started_at, AttemptRow.ended_at)
         .join(JobRow, JobRow.id == AttemptRow.job_id)
         .where(AttemptRow.started_at < win.end, or_(AttemptRow.ended_at.is_(None), AttemptRow.ended_at > win.start)))
    for team, gpus, a, b in s.connection().execute(q):
        x = per_team.setdefault(team, ([], [], []))
        x[0].append(a)
        x[1].append(now if b is None else b)
        x[2].append(gpus)
    teams = sorted({t.name for t in cfg.spec.teams} | set(per_team))
    gpu_h = {t: [float(v) * bucket_s / 3600 for v in _mean_over_buckets(edges, *per_team.get(t, ([], [], [])))]
             for t in teams}
    capacity = sum(n.gpus for n in cfg.nodes)
    total = np.sum([gpu_h[t] for t in teams], axis=0) if teams else np.zeros(buckets)
    busy = [float(100 * h * 3600 / (capacity * bucket_s)) if capacity else 0.0 for h in total]
    nominal = {t.name: sum(q.nominal for q in t.quotas.values()) * bucket_s / 3600 for t in cfg.spec.teams}
    return UsageHistory(win.start, win.end, bucket_s, capacity, gpu_h, nominal, busy)
