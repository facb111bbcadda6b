"""A replay's figures per team and per class: what a what-if compares, and `yard sim` reports.

    breakdown(result, workload) -> {"teams": {TEAM: figures}, "classes": {CLASS: figures}}

Over the measured jobs of each group (`trainyard.sim.result` defines wait and JCT):
- `jobs`, `completed`; `mean_wait_s`, `p99_wait_s` (total pending time, requeues included);
  `mean_jct_s` (completed jobs); `preemptions`; `lost_gpu_hours` (work thrown away and restart
  overheads).
- `busy_gpu_hours`: GPU-hours held. A team's is the integral of its allocation over the whole
  replay (`SimResult.team_series`); a class's is what its completed jobs held: their useful work
  (`duration_s` x GPUs at full size, the same at any size under the simulator's linear scaling)
  plus what they lost.
- teams only: `gpu_share`, the team's GPU-hours over the cluster's GPU-hours from the first
  submission to the replay's end, beside `quota_share`, its nominal quota over the cluster's GPUs.

`yard sim` writes it into report.json (`breakdown`, per policy); `services/whatif.py` shows it
for the configuration in force and the proposed one, side by side.
"""

from __future__ import annotations

from trainyard.sim.result import JobRecord, SimResult, _pct
from trainyard.sim.workload import Workload

Figures = dict[str, float | int]


def _group(jobs: list[JobRecord]) -> Figures:
    done = [r for r in jobs if r.end is not None]
    waits = [r.wait_s for r in jobs]
    jct = [r.end - r.submit for r in done if r.end is not None]
    return {
        "jobs": len(jobs),
        "completed": len(done),
        "mean_wait_s": round(sum(waits) / len(waits), 1) if waits else 0.0,
        "p99_wait_s": round(_pct(waits, 0.99), 1),
        "mean_jct_s": round(sum(jct) / len(jct), 1) if jct else 0.0,
        "preemptions": sum(r.preemptions for r in jobs),
        "lost_gpu_hours": round(sum(r.lost_gpu_s for r in jobs) / 3600, 3),
    }


def _integral(series: list[tuple[float, int]], end: float) -> float:
    """GPU-seconds of a step series (each value holds until the next point) up to `end`."""
    total = 0.0
    for (t0, v), (t1, _) in zip(series, series[1:] + [(end, 0)]):
        total += v * max(0.0, min(t1, end) - t0)
    return total


def breakdown(res: SimResult, workload: Workload) -> dict[str, dict[str, Figures]]:
    """Per team and per class figures of one replay (see the module notes)."""
    measured = [r for r in res.jobs if r.measured]
    by_team: dict[str, list[JobRecord]] = {t: [] for t in workload.teams}
    by_class: dict[str, list[JobRecord]] = {c: [] for c in workload.classes}
    for r in measured:
        by_team.setdefault(r.team, []).append(r)
        by_class.setdefault(r.job_class, []).append(r)
    cap = max(1e-9, res.total_gpus * res.end_time)
    teams: dict[str, Figures] = {}
    for team, jobs in sorted(by_team.items()):
        gpu_s = _integral(res.team_series.get(team, []), res.end_time)
        t = workload.teams.get(team)
        nominal = t.quota("default").nominal if t is not None else 0
        teams[team] = {**_group(jobs), "busy_gpu_hours": round(gpu_s / 3600, 3),
                       "gpu_share": round(gpu_s / cap, 4), "quota_share": round(nominal / max(1, res.total_gpus), 4)}
    classes: dict[str, Figures] = {}
    for cls, jobs in sorted(by_class.items()):
        held = sum(r.duration_s * r.gpus + r.lost_gpu_s for r in jobs if r.end is not None)
        classes[cls] = {**_group(jobs), "busy_gpu_hours": round(held / 3600, 3)}
    return {"teams": teams, "classes": classes}
