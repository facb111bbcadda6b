"""Benchmark: replay every job of the shared Philly file through one policy, on one core.

    .venv/bin/python bench/replay_philly.py [--trace PATH] [--cluster 352x8] [--policy trainyard]

Prints one JSON line: jobs, simulated cycles, wall seconds for loading and for the replay, and
peak resident memory of the process (ru_maxrss). The simulator is single-threaded: it uses one
core whatever the machine has.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from dataclasses import replace

from trainyard.sched.policy import get_policy
from trainyard.sim.estimates import apply_estimates
from trainyard.sim.local_traces import PHILLY_JOBS, local_trace
from trainyard.sim.philly import load_philly
from trainyard.sim.result import metrics
from trainyard.sim.simulator import simulate

DEFAULT_TRACE = local_trace(PHILLY_JOBS)  # $TRAINYARD_TRACES (trainyard.sim.local_traces), or --trace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=DEFAULT_TRACE, required=DEFAULT_TRACE is None,
                    help="the Philly job log (default: under $TRAINYARD_TRACES)")
    ap.add_argument("--cluster", default="352x8")
    ap.add_argument("--policy", default="trainyard")
    ap.add_argument("--estimates", default="user")
    args = ap.parse_args()
    t0 = time.perf_counter()
    wl = load_philly(args.trace, date_from=None, date_to=None, warmup_days=0, cluster=args.cluster)
    jobs = apply_estimates(wl.jobs, args.estimates, 1)
    wl = replace(wl, jobs=jobs)
    t1 = time.perf_counter()
    res = simulate(wl, get_policy(args.policy))
    t2 = time.perf_counter()
    m = metrics(res)
    print(json.dumps({
        "policy": args.policy, "cluster": args.cluster, "jobs": len(wl.jobs), "cycles": res.cycles,
        "load_s": round(t1 - t0, 2), "replay_s": round(t2 - t1, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "utilization": m["utilization"], "avg_jct_s": m["avg_jct_s"],
    }))


if __name__ == "__main__":
    main()
