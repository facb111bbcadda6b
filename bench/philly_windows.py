"""Benchmark: issue 2's acceptance rule on many windows of the Philly trace, not just one week.

    .venv/bin/python bench/philly_windows.py [--starts 2017-09-18,2017-09-22,...] [--days 9]
        [--warmup-days 2] [--cluster 80x8] [--estimates user] [--seed 1] [--workers 2] [--json]
        [--share-below GPU_S]

Each window is what `yard sim --from START --to START+days --warmup-days 2 --policies all` runs
(the validation command's shape: two warm-up days, seven measured), every policy side by side.
For each window it prints trainyard's average JCT, p99 wait and utilization against the best
other policy on each, the goodput beside the utilization (a policy that reruns lost work counts
it as utilization), trainyard's quota violations, and whether the issue's rule holds there:
lower `avg_jct_s` and lower `p99_wait_s` than every other policy, `utilization` no lower than the
best other minus 0.01, and no quota violation.

The default windows start every 3–4 days from 2017-09-18 (earlier ones hold a few dozen jobs,
on which all policies give the same figures) to 2017-10-20, the validation week. Windows run in
parallel on `--workers` processes, one policy run per task. Reports; does not fail on a miss.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Any

from trainyard.sched.engine import EngineParams, TrainyardPolicy
from trainyard.sched.policy import get_policy, policy_names
from trainyard.sim.estimates import apply_estimates
from trainyard.sim.philly import load_philly
from trainyard.sim.result import metrics
from trainyard.sim.simulator import simulate

DEFAULT_TRACE = Path(__file__).resolve().parents[1].parent / "shared/traces/philly/philly_jobs_adaptdl_until_2017-10-28.csv"
DEFAULT_STARTS = ("2017-09-18", "2017-09-22", "2017-09-26", "2017-09-28", "2017-10-02", "2017-10-06", "2017-10-10",
                  "2017-10-13", "2017-10-17", "2017-10-20")
OURS = "trainyard"


def run_one(task: tuple[dict[str, Any], str, str]) -> tuple[str, str, dict[str, Any], float]:
    args, start, policy = task
    end = (dt.date.fromisoformat(start) + dt.timedelta(days=args["days"])).isoformat()
    w = load_philly(args["trace"], date_from=start, date_to=end, warmup_days=args["warmup_days"],
                    cluster=args["cluster"], seed=args["seed"])
    w.jobs = apply_estimates(w.jobs, args["estimates"], args["seed"])
    t0 = time.perf_counter()
    if policy == OURS and args.get("share_below") is not None:
        pol = TrainyardPolicy(EngineParams(share_below_gpu_s=args["share_below"]))
    else:
        pol = get_policy(policy)
    m = metrics(simulate(w, pol))
    return start, policy, m, time.perf_counter() - t0


def verdict(by_policy: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """trainyard against the best other policy on each criterion, and whether the rule holds."""
    ours = by_policy[OURS]
    others = {n: m for n, m in by_policy.items() if n != OURS}
    jct = min(others, key=lambda n: others[n]["avg_jct_s"])
    p99 = min(others, key=lambda n: others[n]["p99_wait_s"])
    util = max(others, key=lambda n: others[n]["utilization"])
    fails = []
    if not ours["avg_jct_s"] < others[jct]["avg_jct_s"]:
        fails.append("jct")
    if not ours["p99_wait_s"] < others[p99]["p99_wait_s"]:
        fails.append("p99")
    if ours["utilization"] < others[util]["utilization"] - 0.01:
        fails.append("util")
    if ours["quota_violations"]:
        fails.append("quota")
    return {"jobs": ours["jobs"], "ours": {k: ours[k] for k in ("avg_jct_s", "p99_wait_s", "utilization", "goodput",
                                                               "quota_violations", "preemptions")},
            "best_jct": [jct, others[jct]["avg_jct_s"]], "best_p99": [p99, others[p99]["p99_wait_s"]],
            "best_util": [util, others[util]["utilization"], others[util]["goodput"]], "fails": fails}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--starts", default=",".join(DEFAULT_STARTS), help="comma-separated first days (YYYY-MM-DD)")
    ap.add_argument("--days", type=int, default=9, help="days loaded per window, warm-up included")
    ap.add_argument("--warmup-days", type=float, default=2.0)
    ap.add_argument("--cluster", default="80x8")
    ap.add_argument("--estimates", default="user")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policies", default=",".join(n for n in policy_names() if n != "partition"),
                    help="the policies compared (default: all but partition, which is never the best)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="one JSON line")
    ap.add_argument("--share-below", type=float, default=None, metavar="GPU_S",
                    help="trainyard with time-sharing of borrowed GPUs on (EngineParams.share_below_gpu_s)")
    a = ap.parse_args()
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    if OURS not in policies:
        ap.error(f"--policies must include {OURS}")
    if len(set(policies)) < 2:
        ap.error(f"--policies needs at least one policy besides {OURS} to compare it with")
    starts = [s.strip() for s in a.starts.split(",") if s.strip()]
    shared = {"trace": a.trace, "days": a.days, "warmup_days": a.warmup_days, "cluster": a.cluster,
              "estimates": a.estimates, "seed": a.seed, "share_below": a.share_below}
    results: dict[str, dict[str, dict[str, Any]]] = {s: {} for s in starts}
    t0 = time.perf_counter()
    with Pool(a.workers) as pool:
        for start, policy, m, _ in pool.imap_unordered(run_one, [(shared, s, p) for s in starts for p in policies]):
            results[start][policy] = m
    rows = {s: verdict(results[s]) for s in starts}
    out = {"bench": "philly_windows", "cluster": a.cluster, "estimates": a.estimates, "seed": a.seed,
           "days": a.days, "warmup_days": a.warmup_days, "policies": policies, "wall_s": round(time.perf_counter() - t0, 1),
           "windows": rows, "holds": sum(not r["fails"] for r in rows.values())}
    if a.json:
        print(json.dumps(out))
        return
    print(f"{'window from':11}  {'jobs':>6}  {'JCT':>7} {'best other':>18}  {'p99 wait':>8} {'best other':>18}  "
          f"{'util/goodput':>12} {'best other util/goodput':>28}  qv  holds")
    for s, r in rows.items():
        o = r["ours"]
        print(f"{s:11}  {r['jobs']:6}  {o['avg_jct_s']:7.0f} {r['best_jct'][1]:8.0f} ({r['best_jct'][0]:>8})  "
              f"{o['p99_wait_s']:8.0f} {r['best_p99'][1]:8.0f} ({r['best_p99'][0]:>8})  "
              f"{o['utilization']:.3f}/{o['goodput']:.3f} {r['best_util'][1]:.3f}/{r['best_util'][2]:.3f} "
              f"({r['best_util'][0]:>8})  {o['quota_violations']:2}  {'yes' if not r['fails'] else 'no: ' + ','.join(r['fails'])}")
    print(f"the rule holds on {out['holds']} of {len(rows)} windows; {out['wall_s']} s")


if __name__ == "__main__":
    main()
