"""What the training tail of `bench/vs_slurm.py` costs in quota, policy by policy, in seconds.

    .venv/bin/python bench/vs_slurm_frontier.py [--seeds 1,2,3]

Why: two of issue 20's lines for the side-by-side run against real Slurm pull against each other
on its workload: "training p99 wait <= Slurm's" and "each team's contended share within 0.05 of its
nominal share". The training tail is team c's 4-GPU jobs; c's nominal quota is 2 GPUs, so each of
them must borrow 2 of the 6 that a and b hold in quota. Slurm, which keeps no quota, starts them
while a and b wait inside theirs. This script shows the price on the simulator proxy of that run
(`vs_slurm_sim.build`: the same jobs, cluster, teams and classes), for schedules that keep the
quotas and for schedules that do not, each with the two figures side by side: the training p99
wait and each team's quota gap, computed by the real run's own rule (`vs_slurm.quota_owed` on
every job's attempts, as the simulator ran them).

Variants (`VARIANTS`): trainyard as configured; trainyard letting a borrower run 4 minutes
before any reclaim (patience far beyond what the class's grace allows); trainyard with no quota
(every nominal the whole pool) at a 24 h and a 10 min training max wait; the simulator's models
of Kueue and of Slurm (`sched/baselines`). The figures of record stay the real run's
(bench/README.md part 11); this is the map of the trade-off behind them.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "bench")]

import vs_slurm  # noqa: E402
import vs_slurm_sim  # noqa: E402
from trainyard.sched.engine import EngineParams, TrainyardPolicy  # noqa: E402
from trainyard.sched.engine_params import PreemptionParams  # noqa: E402
from trainyard.sched.policy import get_policy  # noqa: E402
from trainyard.sim.simulator import simulate  # noqa: E402
from trainyard.sim.workload import Workload  # noqa: E402


@dataclass(frozen=True)
class Variant:
    name: str
    policy: Callable[[], Any]
    keeps_quota: bool  # does the schedule mean to keep the nominal quotas?
    max_wait_training_s: float | None = None  # None: vs_slurm's config (24 h)
    no_quota: bool = False  # every team's nominal quota is the whole pool


VARIANTS = (
    Variant("trainyard", lambda: TrainyardPolicy(EngineParams()), True),
    Variant("trainyard, reclaim after 240 s", lambda: TrainyardPolicy(EngineParams(preemption=PreemptionParams(reclaim_after_s=240.0, reclaim_share=1e9))), True),
    Variant("kueue (model)", lambda: get_policy("kueue"), True),
    Variant("trainyard, no quota", lambda: TrainyardPolicy(EngineParams()), False, no_quota=True),
    Variant("trainyard, no quota, 10 min max wait", lambda: TrainyardPolicy(EngineParams()), False, 600.0, True),
    Variant("slurm (model)", lambda: get_policy("slurm"), False),
)


def without_quota(wl: Workload) -> Workload:
    """The same workload with every team's nominal quota at the whole pool (nothing borrows)."""
    total = sum(n.gpus for n in wl.nodes)
    teams = {name: replace(t, quotas={pool: replace(q, nominal=total) for pool, q in t.quotas.items()})
             for name, t in wl.teams.items()}
    return replace(wl, teams=teams)


def run(seed: int, v: Variant) -> dict[str, Any]:
    wl = vs_slurm_sim.build(seed, max_wait_training_s=v.max_wait_training_s)
    if v.no_quota:
        wl = without_quota(wl)
    attempts: dict[int, list[dict[str, float]]] = {}
    res = simulate(wl, v.policy(), vs_slurm_sim.SIM,
                   on_attempt=lambda job, start, end: attempts.setdefault(job, []).append({"start": start, "end": end}))
    # Gaps are counted against vs_slurm's nominal quotas whatever the variant scheduled with.
    jobs = [vs_slurm.Job(j.req.id, j.req.team, j.req.job_class, j.req.gpus, int(j.duration_s), j.req.submit_time,
                         submit=j.req.submit_time, attempts=attempts.get(j.req.id, []))
            for j in wl.jobs]
    done = [j for j in jobs if j.attempts]
    start, end = min(j.submit for j in done), max(j.attempts[-1]["end"] for j in done)
    owed = vs_slurm.quota_owed(done, start, end)
    figures = vs_slurm_sim.summary(res, worst=0)
    return {"training_p99_s": figures["training"]["wait_p99_s"],
            "training_mean_s": figures["training"]["wait_mean_s"],
            "jct_mean_s": figures["jct_mean_s"],
            "gaps": {t: owed[t]["gap"] for t in vs_slurm.TEAMS},
            "unfinished": sum(r.end is None for r in res.jobs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3", help="workload seeds (vs_slurm.py runs seed 1)")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    print(f"{'variant':40} {'keeps quota':>11} " + " ".join(
        f"{'s' + str(s) + ' p99':>8} {'gap max':>7} {'JCT':>6}" for s in seeds))
    for v in VARIANTS:
        cells = []
        for seed in seeds:
            r = run(seed, v)
            gap = max((g for g in r["gaps"].values() if g is not None), default=0.0)
            cells.append(f"{r['training_p99_s']:8.1f} {gap:7.3f} {r['jct_mean_s']:6.1f}")
        print(f"{v.name:40} {'yes' if v.keeps_quota else 'no':>11} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
