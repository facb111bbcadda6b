"""Benchmark: start-time estimates on the ten Philly windows, limit-based against learned (issue 40).

    TRAINYARD_TRACES=DIR .venv/bin/python bench/estimates.py [--starts 2017-09-18,...] [--days 9]
        [--warmup-days 2] [--cluster 80x8] [--estimates user] [--seed 1] [--workers 2] [--json]

Each window of `bench/philly_windows.py` (its `DEFAULT_STARTS`, the same loader arguments) is run
through trainyard's policy at one load (`--cluster`, 80 x 8 by default: the dev windows' size) twice:
with the start estimator `limit` (every job assumed to run to its limit, the user's estimate) and
`learned` (run times learned from the completed jobs of the same virtual cluster, GPU count and
limit: `sim/estimates.py`). For the measured jobs that waited, it prints per window and overall the
p50 and p90 of |actual first start − first estimated start| and the share that started more than a
minute late. The overall figures are over every waiting job of the ten windows together.
The estimator changes no decision: both runs' waits and JCTs are the same, which it checks.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ as a script: philly_windows beside it

from philly_windows import DEFAULT_STARTS, DEFAULT_TRACE, OURS  # noqa: E402

from trainyard.sched.policy import get_policy  # noqa: E402
from trainyard.sim.estimates import START_ESTIMATORS, apply_estimates  # noqa: E402
from trainyard.sim.philly import load_philly  # noqa: E402
from trainyard.sim.result import LATE_AFTER_S, _pct, first_estimate_errors, metrics  # noqa: E402
from trainyard.sim.simulator import SimParams, simulate  # noqa: E402


def run_one(task: tuple[dict[str, Any], str, str]) -> tuple[str, str, dict[str, Any], list[float], float]:
    """One window through trainyard with one start estimator: its metrics and every waiting job's
    signed error (actual − estimate), for the overall percentiles."""
    import datetime as dt
    args, start, estimator = task
    end = (dt.date.fromisoformat(start) + dt.timedelta(days=args["days"])).isoformat()
    w = load_philly(args["trace"], date_from=start, date_to=end, warmup_days=args["warmup_days"],
                    cluster=args["cluster"], seed=args["seed"])
    w.jobs = apply_estimates(w.jobs, args["estimates"], args["seed"])
    t0 = time.perf_counter()
    res = simulate(w, get_policy(OURS), SimParams(start_estimator=estimator))
    errs = first_estimate_errors(res.jobs)
    return start, estimator, metrics(res), errs, time.perf_counter() - t0


def summary(errs: list[float]) -> dict[str, Any]:
    a = [abs(e) for e in errs]
    return {"waited": len(errs), "p50_abs_err_s": round(_pct(a, 0.5), 1), "p90_abs_err_s": round(_pct(a, 0.9), 1),
            "late_share": round(sum(1 for e in errs if e > LATE_AFTER_S) / len(errs), 4) if errs else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=DEFAULT_TRACE, required=DEFAULT_TRACE is None,
                    help="the Philly jobs CSV (default: under $TRAINYARD_TRACES)")
    ap.add_argument("--starts", default=",".join(DEFAULT_STARTS), help="comma-separated first days (YYYY-MM-DD)")
    ap.add_argument("--days", type=int, default=9, help="days loaded per window, warm-up included")
    ap.add_argument("--warmup-days", type=float, default=2.0)
    ap.add_argument("--cluster", default="80x8", help="NODESxGPUS, the load")
    ap.add_argument("--estimates", default="user", help="the limits jobs carry (sim/estimates.py's modes)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="one JSON line")
    a = ap.parse_args()
    args = {"trace": str(a.trace), "days": a.days, "warmup_days": a.warmup_days, "cluster": a.cluster,
            "estimates": a.estimates, "seed": a.seed}
    starts = [s.strip() for s in a.starts.split(",") if s.strip()]
    tasks = [(args, s, e) for s in starts for e in START_ESTIMATORS]
    t0 = time.perf_counter()
    with Pool(a.workers) as pool:
        done = pool.map(run_one, tasks, chunksize=1)
    wall = time.perf_counter() - t0
    by: dict[str, dict[str, Any]] = {s: {} for s in starts}
    every: dict[str, list[float]] = {e: [] for e in START_ESTIMATORS}
    same = True
    for start, est, m, errs, secs in done:
        by[start][est] = {**summary(errs), "sim_s": round(secs, 1), "avg_wait_s": m["avg_wait_s"],
                          "avg_jct_s": m["avg_jct_s"]}
        every[est].extend(errs)
    for s in starts:
        lim, lrn = by[s]["limit"], by[s]["learned"]
        same &= (lim["avg_wait_s"], lim["avg_jct_s"]) == (lrn["avg_wait_s"], lrn["avg_jct_s"])
    overall = {e: summary(every[e]) for e in START_ESTIMATORS}
    out = {"bench": "estimates", "args": {k: v for k, v in args.items() if k != "trace"}, "windows": by,
           "overall": overall, "decisions_unchanged": same, "wall_s": round(wall, 1), "workers": a.workers}
    if a.json:
        print(json.dumps(out))
        return
    print(f"trainyard on {a.cluster}, estimates {a.estimates}, seed {a.seed}; jobs that waited: "
          "p50 / p90 |actual - first estimate| (h), share late by > 1 min")
    print(f"{'window':<12}{'waited':>7}  {'limit p50':>10}{'p90':>8}{'late':>7}  {'learned p50':>12}{'p90':>8}{'late':>7}")
    rows = [(s, by[s]) for s in starts] + [("overall", overall)]
    for name, r in rows:
        lim, lrn = r["limit"], r["learned"]
        print(f"{name:<12}{lim['waited']:>7}  {lim['p50_abs_err_s'] / 3600:>10.2f}{lim['p90_abs_err_s'] / 3600:>8.2f}"
              f"{lim['late_share']:>7.1%}  {lrn['p50_abs_err_s'] / 3600:>12.2f}{lrn['p90_abs_err_s'] / 3600:>8.2f}"
              f"{lrn['late_share']:>7.1%}")
    better = sum(by[s]["learned"]["p50_abs_err_s"] < by[s]["limit"]["p50_abs_err_s"] for s in starts)
    print(f"learned better on p50 in {better} of {len(starts)} windows; decisions unchanged: {same}; "
          f"{wall:.0f} s on {a.workers} workers")


if __name__ == "__main__":
    main()
