"""Utilization and queue wait over time, for the dashboard, derived from rows the store already
keeps: no sampling, no table of its own.

- GPUs allocated: each attempt holds its placement's GPUs from `started_at` to `ended_at` (still
  running: to now); averaged over each bucket of the window. This is allocation, what the
  scheduler controls; NVML busy-ness is not kept over time (Prometheus scrapes it, `/metrics`).
  A GPU shared by jobs that ask for GPU memory (`--gpu-mem`) counts once per job.
- Jobs waiting: a job waits from its submission to its first attempt's start, from each attempt's
  end to the next one's start, and, while it is pending, from `queued_since` to now (held jobs
  count: they are in the queue, as in `trainyard_queue_length`); a job cancelled while waiting
  stops waiting at its end. Averaged over each bucket, like the allocation.
- Wait of started attempts: for each attempt started in a bucket, the time from its submission
  (or the previous attempt's end) to its start, as `trainyard_queue_wait_seconds` counts it;
  mean and max per bucket.

The window's capacity is the configuration in force now: a cluster that grew shows its past
allocation against today's GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from trainyard.services.config import ConfigVersion
from trainyard.states import PENDING_STATES
from trainyard.store.models import AttemptRow, JobRow

WINDOWS = {"15m": 900.0, "1h": 3600.0, "6h": 6 * 3600.0, "24h": 86400.0, "7d": 7 * 86400.0}
BUCKETS = 60


@dataclass
class History:
    start: float
    end: float
    capacity: int  # GPUs in the configuration now
    allocated: list[float]  # mean GPUs held by jobs, per bucket
    waiting: list[float]  # mean jobs waiting, per bucket
    wait_mean_s: list[float | None]  # mean wait of the attempts started in the bucket (None: none started)
    wait_max_s: list[float | None]
    started: list[int]  # attempts started per bucket

    @property
    def bucket_s(self) -> float:
        return (self.end - self.start) / len(self.allocated)

    @property
    def centers(self) -> list[float]:
        b = self.bucket_s
        return [self.start + (i + 0.5) * b for i in range(len(self.allocated))]


def _mean_over_buckets(edges: np.ndarray, begin: Sequence[float], end: Sequence[float], weight: Sequence[float]) -> np.ndarray:
    """Sum over intervals of weight x (overlap with each bucket / bucket length)."""
    out = np.zeros(len(edges) - 1)
    if not begin:
        return out
    b, e, w = np.asarray(begin), np.asarray(end), np.asarray(weight, dtype=float)
    for i in range(0, len(b), 4096):  # bounded memory: 4096 intervals x buckets at a time
        lo = np.maximum(b[i:i + 4096, None], edges[None, :-1])
        hi = np.minimum(e[i:i + 4096, None], edges[None, 1:])
        out += (np.clip(hi - lo, 0.0, None) * w[i:i + 4096, None]).sum(axis=0)
    return out / np.diff(edges)


def history(s: Session, cfg: ConfigVersion, now: float, window_s: float, buckets: int = BUCKETS) -> History:
    t0, t1 = now - window_s, now
    edges = np.linspace(t0, t1, buckets + 1)
    # Attempts overlapping the window hold GPUs in it.
    held_b, held_e, held_w = [], [], []
    q = select(AttemptRow.started_at, AttemptRow.ended_at, AttemptRow.placement).where(
        AttemptRow.started_at < t1, or_(AttemptRow.ended_at.is_(None), AttemptRow.ended_at > t0))
    for started, ended, placement in s.execute(q):
        held_b.append(started)
        held_e.append(now if ended is None else ended)
        held_w.append(sum(len(p.get("gpus", ())) for p in placement or []))
    # Jobs that may have waited in the window: submitted before its end, not ended before its start.
    in_window = (JobRow.submit_time < t1, or_(JobRow.end_time.is_(None), JobRow.end_time > t0))
    job_rows = {r.id: r for r in s.execute(select(JobRow.id, JobRow.submit_time, JobRow.queued_since, JobRow.state,
                                                  JobRow.end_time).where(*in_window))}
    tries: dict[int, list[tuple[float, float | None]]] = {}
    q = (select(AttemptRow.job_id, AttemptRow.started_at, AttemptRow.ended_at)
         .join(JobRow, JobRow.id == AttemptRow.job_id).where(*in_window).order_by(AttemptRow.attempt))
    for jid, started, ended in s.execute(q):
        tries.setdefault(jid, []).append((started, ended))
    wait_b, wait_e, starts, waits = [], [], [], []
    for jid, j in job_rows.items():
        cursor: float | None = j.submit_time
        for started, ended in tries.get(jid, ()):
            if cursor is not None:
                wait_b.append(cursor)
                wait_e.append(started)
                starts.append(started)
                waits.append(max(0.0, started - cursor))
            cursor = ended
        if cursor is None:
            continue  # running
        if j.state in PENDING_STATES:
            wait_b.append(max(cursor, j.queued_since or cursor))
            wait_e.append(now)
        elif j.end_time is not None and j.end_time > max(cursor, j.queued_since or cursor):
            wait_b.append(max(cursor, j.queued_since or cursor))  # ended (cancelled) while waiting
            wait_e.append(j.end_time)
    allocated = _mean_over_buckets(edges, held_b, held_e, held_w)
    waiting = _mean_over_buckets(edges, wait_b, wait_e, [1.0] * len(wait_b))
    n = np.zeros(buckets, dtype=int)
    total, peak = np.zeros(buckets), np.zeros(buckets)
    if starts:
        st = np.asarray(starts)
        ok = (st >= t0) & (st < t1)
        idx = np.minimum(((st[ok] - t0) / (window_s / buckets)).astype(int), buckets - 1)
        w = np.asarray(waits)[ok]
        np.add.at(n, idx, 1)
        np.add.at(total, idx, w)
        np.maximum.at(peak, idx, w)
    return History(
        start=t0, end=t1, capacity=sum(nd.gpus for nd in cfg.nodes),
        allocated=[float(x) for x in allocated], waiting=[float(x) for x in waiting],
        wait_mean_s=[float(total[i] / n[i]) if n[i] else None for i in range(buckets)],
        wait_max_s=[float(peak[i]) if n[i] else None for i in range(buckets)],
        started=[int(x) for x in n],
    )
