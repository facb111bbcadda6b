"""What a simulation run records, and the report metrics computed from it.

Definitions (also in docs/simulator.md):
- `jobs`: jobs submitted inside the measurement window (after the warm-up).
- `utilization`: allocated GPU-seconds inside the window / (GPUs × window length).
- `goodput`: like utilization, but counting only useful work: GPU-seconds later thrown away by a
  preemption or failure (work since the last checkpoint) and restart overheads are left out.
- `avg_jct_s`, `p50_jct_s`, `p99_jct_s`: job completion time, completion − submission.
- `avg_wait_s`, `p99_wait_s`: total time a job spends pending: from submission to its first start
  plus every stretch spent requeued after a preemption or a failure.
- `first_wait_p99_s`: p99 of submission → first start only (Slurm's "wait"), for reference.
- `avg_bounded_slowdown`: mean of max(1, JCT / max(run time, 10 s)), run time being the job's
  true run time at its requested size.
- `makespan_s`: first submission → last completion among measured jobs.
- `preemptions`: preemptions suffered by measured jobs.
- `lost_gpu_hours`: GPU-hours of measured jobs' work thrown away: at a failure, or a preemption
  whose notice is not honoured, the work since the last checkpoint; at a preemption honoured by a
  checkpoint on the notice, the time spent saving; plus every restart overhead.
- `lost_gpu_hours_if_ignored`: the same, had every preemption notice been ignored (same
  decisions): what the checkpoint on notice saves.
- `lost_frac`: GPU-seconds lost inside the window / capacity (utilization − goodput).
- `jain_fairness`: Jain's index over teams of 1 / (the team's mean bounded slowdown): 1.0 when
  every team's jobs are slowed down alike.
- `est_waited`, `est_p50_abs_err_s`, `est_p90_abs_err_s`, `est_late_share` (with a start estimator,
  `SimParams.start_estimator`): of the measured jobs that waited, the absolute error of their first
  estimated start (p50, p90) and the share that started more than a minute after it (sim/estimates.py).
- `quota_violations`: episodes in which a team had a pending job that fits inside its unused
  nominal quota while another team of its cohort held more than its own nominal quota, for longer
  than its borrowers' grace period plus min run time (GPUs it was owed stayed with a borrower;
  free GPUs of the wrong shape are no quota matter, and a team no one borrows from is never owed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainyard.sched.types import JobId

# A job that starts more than this after its estimated start started late: the plane's loop passes
# are seconds apart. The control plane's figure too (services/estimates.py).
LATE_AFTER_S = 60.0


@dataclass(slots=True)
class JobRecord:
    id: JobId
    team: str
    job_class: str
    gpus: int
    submit: float
    duration_s: float  # true run time at its requested size
    first_start: float | None = None
    end: float | None = None
    wait_s: float = 0.0  # total pending time
    preemptions: int = 0
    failures: int = 0
    lost_gpu_s: float = 0.0
    lost_if_ignored_gpu_s: float = 0.0  # the same had every preemption notice been ignored
    measured: bool = True
    # the first estimated start of its first wait, with a start estimator on (sim/estimates.py)
    first_est: float | None = None


@dataclass(slots=True)
class SimResult:
    policy: str
    total_gpus: int
    measure_from: float
    measure_to: float
    jobs: list[JobRecord]
    # (time, allocated GPUs) whenever the allocation changes; a step function
    util_series: list[tuple[float, int]] = field(default_factory=list)
    # team -> (time, allocated GPUs) sampled at every change of that team's allocation
    team_series: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    nominal: dict[str, int] = field(default_factory=dict)
    busy_gpu_s_in_window: float = 0.0
    lost_gpu_s_in_window: float = 0.0
    quota_violations: int = 0
    quota_violation_s: float = 0.0
    quota_violation_gpu_s: float = 0.0  # GPU-s owed during those episodes (owed GPUs x time)
    cycles: int = 0
    wall_s: float = 0.0
    end_time: float = 0.0
    start_estimator: str | None = None  # SimParams.start_estimator: the estimate errors are reported


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def jain(xs: list[float]) -> float:
    if not xs or not any(xs):
        return 1.0
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def bounded_slowdown(r: JobRecord, tau: float = 10.0) -> float:
    assert r.end is not None
    return max(1.0, (r.end - r.submit) / max(r.duration_s, tau))


def metrics(res: SimResult) -> dict[str, float | int]:
    jobs = [r for r in res.jobs if r.measured]
    done = [r for r in jobs if r.end is not None]
    jct = [r.end - r.submit for r in jobs if r.end is not None]  # (done's)
    waits = [r.wait_s for r in jobs]
    first = [r.first_start - r.submit for r in jobs if r.first_start is not None]
    bsd = [bounded_slowdown(r) for r in done]
    window = max(1e-9, res.measure_to - res.measure_from)
    cap = res.total_gpus * window
    by_team: dict[str, list[float]] = {}
    for r in done:
        by_team.setdefault(r.team, []).append(bounded_slowdown(r))
    team_inv = [1.0 / (sum(v) / len(v)) for v in by_team.values()]
    ends = [r.end for r in jobs if r.end is not None]  # (done's)
    return {
        "jobs": len(jobs),
        "completed": len(done),
        "utilization": round(res.busy_gpu_s_in_window / cap, 4),
        "goodput": round(max(0.0, res.busy_gpu_s_in_window - res.lost_gpu_s_in_window) / cap, 4),
        "avg_jct_s": round(sum(jct) / len(jct), 1) if jct else 0.0,
        "p50_jct_s": round(_pct(jct, 0.5), 1),
        "p99_jct_s": round(_pct(jct, 0.99), 1),
        "avg_wait_s": round(sum(waits) / len(waits), 1) if waits else 0.0,
        "p99_wait_s": round(_pct(waits, 0.99), 1),
        "first_wait_p99_s": round(_pct(first, 0.99), 1),
        "avg_bounded_slowdown": round(sum(bsd) / len(bsd), 3) if bsd else 0.0,
        "makespan_s": round(max(ends) - min(r.submit for r in jobs), 1) if ends else 0.0,
        "preemptions": sum(r.preemptions for r in jobs),
        "failures": sum(r.failures for r in jobs),
        "lost_gpu_hours": round(sum(r.lost_gpu_s for r in jobs) / 3600, 2),
        "lost_gpu_hours_if_ignored": round(sum(r.lost_if_ignored_gpu_s for r in jobs) / 3600, 2),
        "lost_frac": round(res.lost_gpu_s_in_window / cap, 5),
        "jain_fairness": round(jain(team_inv), 4),
        "quota_violations": res.quota_violations,
        "quota_owed_gpu_hours": round(res.quota_violation_gpu_s / 3600, 2),
        "cycles": res.cycles,
        "sim_wall_s": round(res.wall_s, 2),
        **(estimate_errors(jobs) if res.start_estimator else {}),
    }


def first_estimate_errors(jobs: list[JobRecord]) -> list[float]:
    """Actual first start − first estimated start of each measured job that waited (it got an
    estimate and started later than it arrived)."""
    return [r.first_start - r.first_est for r in jobs
            if r.measured and r.first_est is not None and r.first_start is not None and r.first_start > r.submit]


def estimate_errors(jobs: list[JobRecord]) -> dict[str, float | int]:
    """The errors of the first estimates (`first_estimate_errors`): counts, p50 and p90 of their
    absolute value, and the share of those jobs that started more than `LATE_AFTER_S` late."""
    errs = first_estimate_errors(jobs)
    absolute = [abs(e) for e in errs]
    return {
        "est_waited": len(errs),
        "est_p50_abs_err_s": round(_pct(absolute, 0.5), 1),
        "est_p90_abs_err_s": round(_pct(absolute, 0.9), 1),
        "est_late_share": round(sum(1 for e in errs if e > LATE_AFTER_S) / len(errs), 4) if errs else 0.0,
    }
