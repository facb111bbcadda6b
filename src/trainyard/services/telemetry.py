"""Per-GPU telemetry in the store (issue 39): the sampler's periods in, a job's series and its
summaries out (docs/control-plane.md, "GPU telemetry").

Writes, by the plane's sampler (control/lifecycle/telemetry.py) at each flush, in its transaction:
`flush` adds one `gpu_samples` row per GPU and period, folds the period into the attempt's
`gpu_summary` ({"<node>/<gpu>": {util_mean, util_peak, mem_peak_mib, samples}}, the mean weighted
by readings), and keeps each job's rows bounded: over `max_rows`, the oldest half of its rows (by
time) is thinned by merging neighbours of one GPU's series in pairs (periods added, means weighted
by period, peaks kept), so an old stretch keeps its shape at half the resolution and the newest
stays fine; nothing is dropped outright, and the summary (kept apart) is exact whatever was merged.

Reads: `series` (GET /api/v1/jobs/{id}/gpus, the dashboard's plot) and `acct_figures` (`yard acct`'s
gpuutil, gpuutilmax, gpumem, from the attempts' summaries).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from trainyard.store.models import AttemptRow, GpuSampleRow


@dataclass
class Period:
    """One GPU's readings while one attempt held it, over one flush period."""

    job_id: int
    attempt: int
    node: str
    gpu: int
    start: float
    end: float
    source: str
    samples: int = 0
    util_sum: float = 0.0
    util_peak: float = 0.0
    mem_peak: float = 0.0
    power_sum: float = 0.0
    power_n: int = 0
    temp_max: float | None = None

    def add(self, util: float, mem_mib: float, power_w: float | None, temp_c: float | None, at: float) -> None:
        self.samples += 1
        self.util_sum += util
        self.util_peak = max(self.util_peak, util)
        self.mem_peak = max(self.mem_peak, mem_mib)
        if power_w is not None:
            self.power_sum += power_w
            self.power_n += 1
        if temp_c is not None:
            self.temp_max = temp_c if self.temp_max is None else max(self.temp_max, temp_c)
        self.end = max(self.end, at)


def flush(s: Session, periods: Iterable[Period], now: float, max_rows: int) -> int:
    """Store the periods (those with readings) as rows and summaries; returns the rows merged away."""
    jobs: set[int] = set()
    by_attempt: dict[tuple[int, int], list[Period]] = {}
    for p in periods:
        if p.samples == 0:
            continue
        s.add(GpuSampleRow(job_id=p.job_id, attempt=p.attempt, node=p.node, gpu=p.gpu, time=now,
                           period_s=max(now - p.start, 0.0), util=p.util_sum / p.samples, util_peak=p.util_peak,
                           mem_mib=p.mem_peak, power_w=p.power_sum / p.power_n if p.power_n else None,
                           temp_c=p.temp_max, source=p.source))
        by_attempt.setdefault((p.job_id, p.attempt), []).append(p)
        jobs.add(p.job_id)
    for (job_id, attempt), ps in by_attempt.items():
        row = s.execute(select(AttemptRow).where(AttemptRow.job_id == job_id, AttemptRow.attempt == attempt)
                        ).scalar_one_or_none()
        if row is not None:
            row.gpu_summary = _summed(dict(row.gpu_summary or {}), ps)  # a new dict: the JSON column is rewritten
    s.flush()
    return sum(thin(s, j, max_rows) for j in sorted(jobs))


def _summed(summary: dict[str, Any], periods: list[Period]) -> dict[str, Any]:
    for p in periods:
        key = f"{p.node}/{p.gpu}"
        old = summary.get(key) or {}
        n0 = int(old.get("samples", 0))
        n = n0 + p.samples
        summary[key] = {
            "util_mean": round((float(old.get("util_mean", 0.0)) * n0 + p.util_sum) / n, 2),
            "util_peak": round(max(float(old.get("util_peak", 0.0)), p.util_peak), 2),
            "mem_peak_mib": round(max(float(old.get("mem_peak_mib", 0.0)), p.mem_peak), 1),
            "samples": n,
        }
    return summary


def thin(s: Session, job_id: int, max_rows: int) -> int:
    """Merge pairs among the job's oldest half of rows until it has at most `max_rows`; returns how
    many rows were merged away."""
    gone = 0
    while True:
        n = s.execute(select(func.count()).select_from(GpuSampleRow).where(GpuSampleRow.job_id == job_id)).scalar_one()
        if n <= max_rows:
            return gone
        rows = s.execute(select(GpuSampleRow).where(GpuSampleRow.job_id == job_id)
                         .order_by(GpuSampleRow.time, GpuSampleRow.id).limit(n // 2)).scalars().all()
        series: dict[tuple[int, str, int], list[GpuSampleRow]] = {}
        for r in rows:
            series.setdefault((r.attempt, r.node, r.gpu), []).append(r)
        doomed: list[int] = []
        for rs in series.values():
            for a, b in zip(rs[0::2], rs[1::2]):
                _merge_into(b, a)
                doomed.append(a.id)
        if not doomed:
            return gone  # every series in the oldest half has one row: nothing left to merge
        s.execute(delete(GpuSampleRow).where(GpuSampleRow.id.in_(doomed)))
        s.flush()
        gone += len(doomed)


def _merge_into(b: GpuSampleRow, a: GpuSampleRow) -> None:
    """`b` (the later row) becomes the two periods together."""
    pa, pb = max(a.period_s, 0.0), max(b.period_s, 0.0)
    total = pa + pb
    wa, wb = (pa / total, pb / total) if total > 0 else (0.5, 0.5)
    b.util = a.util * wa + b.util * wb
    b.util_peak = max(a.util_peak, b.util_peak)
    b.mem_mib = max(a.mem_mib, b.mem_mib)
    if a.power_w is not None and b.power_w is not None:
        b.power_w = a.power_w * wa + b.power_w * wb
    elif b.power_w is None:
        b.power_w = a.power_w
    temps = [t for t in (a.temp_c, b.temp_c) if t is not None]
    b.temp_c = max(temps) if temps else None
    b.period_s = total


def series(s: Session, job_id: int) -> dict[str, Any]:
    """The job's rows as one series per attempt and GPU, oldest first: each point
    [time, period_s, util, util_peak, mem_mib, power_w, temp_c] (`time`: the end of its period)."""
    rows = s.execute(select(GpuSampleRow.attempt, GpuSampleRow.node, GpuSampleRow.gpu, GpuSampleRow.source,
                            GpuSampleRow.time, GpuSampleRow.period_s, GpuSampleRow.util, GpuSampleRow.util_peak,
                            GpuSampleRow.mem_mib, GpuSampleRow.power_w, GpuSampleRow.temp_c)
                     .where(GpuSampleRow.job_id == job_id)
                     .order_by(GpuSampleRow.attempt, GpuSampleRow.node, GpuSampleRow.gpu, GpuSampleRow.time)).all()
    out: dict[tuple[int, str, int], dict[str, Any]] = {}
    for r in rows:
        one = out.setdefault((r.attempt, r.node, r.gpu), {"attempt": r.attempt, "node": r.node, "gpu": r.gpu,
                                                         "source": r.source, "points": []})
        one["points"].append([r.time, r.period_s, r.util, r.util_peak, r.mem_mib, r.power_w, r.temp_c])
    summaries = s.execute(select(AttemptRow.attempt, AttemptRow.gpu_summary).where(AttemptRow.job_id == job_id)
                          .order_by(AttemptRow.attempt)).all()
    return {"job_id": job_id,
            "fields": ["time", "period_s", "util", "util_peak", "mem_mib", "power_w", "temp_c"],
            "gpus": list(out.values()),
            "summary": {str(a): summary for a, summary in summaries if summary}}


def acct_figures(summaries: Iterable[dict[str, Any] | None]) -> dict[str, float | None]:
    """`yard acct`'s telemetry over some attempts' `gpu_summary`s: the mean utilization of their
    GPUs (weighted by readings), the highest any GPU reached, and the highest memory any GPU held;
    None where no GPU was read."""
    n, total, peak, mem = 0, 0.0, None, None
    for summary in summaries:
        for g in (summary or {}).values():
            k = int(g.get("samples", 0))
            n += k
            total += float(g.get("util_mean", 0.0)) * k
            peak = max(peak or 0.0, float(g.get("util_peak", 0.0)))
            mem = max(mem or 0.0, float(g.get("mem_peak_mib", 0.0)))
    return {"gpu_util_mean": round(total / n, 2) if n else None, "gpu_util_peak": peak, "gpu_mem_peak_mib": mem}
