"""The simulator oracle: every report of the Philly dev windows and the Pollux workloads, kept and compared.

    PYTHONPATH=src .venv/bin/python bench/sim_oracle.py --out DIR [--philly FILE] [--pollux DIR]
        [--policies trainyard] [--clusters 80x8,56x8] [--starts ...] [--workers 2] [--resume]
    .venv/bin/python bench/sim_oracle.py --compare DIR_A DIR_B

Why: a refactoring of the engine must not change one decision. The figures of
`bench/philly_windows.py` and `bench/pollux_workloads.py` are deterministic (the simulator owns the
clock, the engine is pure), so the strongest check of "nothing changed" is to run the same
workloads before and after and compare every report byte for byte. The first form runs the ten
Philly windows of `bench/philly_windows.py` (nine days loaded, two of warm-up, user estimates,
seed 1) at both loads (80 x 8 and 56 x 8) and the eight Pollux workloads (`las: true`), and writes
one JSON file per run into DIR: the report's metrics (`sim.result.metrics`) less the wall-time
field `sim_wall_s`, plus a SHA-256 of every job's record (start, end, wait, preemptions, lost
work) and of the allocation series, so a change that moves one job and cancels out in the means
is still seen. The second form prints `identical` or `different` per report (and which fields
differ) and exits 1 on any difference or any report missing on one side.

Traces: `--philly FILE` (the Philly CSV) and `--pollux DIR` (the folder of `workload-N.csv`);
by default both are found under the directory in the `TRAINYARD_TRACES` environment variable
(`philly/philly_jobs_adaptdl_until_2017-10-28.csv`, `pollux-sia-workloads/pollux_workloads`).

Policies: by default `trainyard` only (the engine a refactoring touches; the baselines'
reports change only if their own code does); `--policies all` runs every registered policy.
Which `trainyard` package ran is printed on stderr: run it with `PYTHONPATH=<worktree>/src`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import sys
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import trainyard
from trainyard.sched.policy import get_policy, policy_names
from trainyard.sim.estimates import apply_estimates
from trainyard.sim.philly import load_philly
from trainyard.sim.pollux import load_pollux
from trainyard.sim.result import SimResult, metrics
from trainyard.sim.simulator import simulate
from trainyard.sim.workload import Workload

# The windows and their shape are those of bench/philly_windows.py (kept in step by hand: that
# script's defaults are its command line, and importing it would tie the two scripts' arguments).
PHILLY_STARTS = ("2017-09-18", "2017-09-22", "2017-09-26", "2017-09-28", "2017-10-02", "2017-10-06", "2017-10-10",
                 "2017-10-13", "2017-10-17", "2017-10-20")
PHILLY_CLUSTERS = ("80x8", "56x8")
PHILLY_DAYS = 9
PHILLY_WARMUP_DAYS = 2.0
POLLUX_WORKLOADS = range(1, 9)
ESTIMATES = "user"
SEED = 1
PHILLY_FILE = Path("philly/philly_jobs_adaptdl_until_2017-10-28.csv")
POLLUX_DIR = Path("pollux-sia-workloads/pollux_workloads")
WALL_TIME_FIELDS = ("sim_wall_s",)


def _digest(rows: Any) -> str:
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def report(res: SimResult) -> dict[str, Any]:
    """One run's report without its wall time, and digests of what the means could hide."""
    m = {k: v for k, v in metrics(res).items() if k not in WALL_TIME_FIELDS}
    jobs = [[r.id, r.team, r.job_class, r.gpus, r.submit, r.first_start, r.end, r.wait_s, r.preemptions,
             r.failures, r.lost_gpu_s, r.lost_if_ignored_gpu_s, r.measured] for r in res.jobs]
    return {"metrics": m, "jobs_sha256": _digest(jobs), "util_series_sha256": _digest(res.util_series),
            "team_series_sha256": _digest(sorted(res.team_series.items())), "end_time": res.end_time}


def run_one(task: tuple[str, dict[str, Any], str]) -> tuple[str, dict[str, Any], float]:
    """Load one workload, simulate one policy on it; (report name, report, seconds)."""
    kind, where, policy = task
    w: Workload
    if kind == "philly":
        end = (dt.date.fromisoformat(where["start"]) + dt.timedelta(days=PHILLY_DAYS)).isoformat()
        w = load_philly(where["trace"], date_from=where["start"], date_to=end, warmup_days=PHILLY_WARMUP_DAYS,
                        cluster=where["cluster"], seed=SEED)
    else:
        w = load_pollux(Path(where["dir"]) / f"workload-{where['k']}.csv", las=True)
    name = report_name(kind, where, policy)
    w.jobs = apply_estimates(w.jobs, ESTIMATES, SEED)
    t0 = time.perf_counter()
    out = report(simulate(w, get_policy(policy)))
    return name, out, time.perf_counter() - t0


def report_name(kind: str, where: dict[str, Any], policy: str) -> str:
    if kind == "philly":
        return f"philly_{where['cluster']}_{where['start']}_{policy}"
    return f"pollux_workload-{where['k']}_{policy}"


def tasks(philly: Path, pollux: Path, policies: list[str], clusters: list[str],
          starts: list[str]) -> list[tuple[str, dict[str, Any], str]]:
    out: list[tuple[str, dict[str, Any], str]] = []
    for p in policies:
        out += [("philly", {"trace": str(philly), "cluster": c, "start": s}, p) for c in clusters for s in starts]
        out += [("pollux", {"dir": str(pollux), "k": k}, p) for k in POLLUX_WORKLOADS]
    return out


def compare(a: Path, b: Path) -> int:
    """Print identical/different per report of A and B; 1 on any difference or missing report."""
    names = sorted({p.name for p in a.glob("*.json")} | {p.name for p in b.glob("*.json")})
    if not names:
        print(f"no reports in {a} or {b}")
        return 1
    bad = 0
    for name in names:
        pa, pb = a / name, b / name
        if not pa.exists() or not pb.exists():
            print(f"{name}: missing in {b if pa.exists() else a}")
            bad += 1
            continue
        ra, rb = json.loads(pa.read_text()), json.loads(pb.read_text())
        if ra == rb:
            print(f"{name}: identical")
            continue
        bad += 1
        keys = sorted({*ra, *rb, *(f"metrics.{k}" for k in {**ra.get("metrics", {}), **rb.get("metrics", {})})})
        diff = [k for k in keys if _get(ra, k) != _get(rb, k) and k != "metrics"]
        print(f"{name}: different ({', '.join(f'{k}: {_get(ra, k)} -> {_get(rb, k)}' for k in diff)})")
    print(f"{len(names) - bad} of {len(names)} reports identical")
    return 1 if bad else 0


def _get(d: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        d = d.get(part) if isinstance(d, dict) else None  # type: ignore[assignment]
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="write one JSON report per run here")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("DIR_A", "DIR_B"))
    ap.add_argument("--philly", type=Path, default=None, help="the Philly CSV (default: $TRAINYARD_TRACES/" f"{PHILLY_FILE})")
    ap.add_argument("--pollux", type=Path, default=None,
                    help=f"the folder of workload-N.csv (default: $TRAINYARD_TRACES/{POLLUX_DIR})")
    ap.add_argument("--policies", default="trainyard", help="comma-separated, or `all` (default: trainyard)")
    ap.add_argument("--clusters", default=",".join(PHILLY_CLUSTERS))
    ap.add_argument("--starts", default=",".join(PHILLY_STARTS))
    ap.add_argument("--no-philly", action="store_true")
    ap.add_argument("--no-pollux", action="store_true")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--resume", action="store_true", help="skip the runs whose report is already in --out")
    a = ap.parse_args()
    if a.compare:
        sys.exit(compare(*a.compare))
    if a.out is None:
        ap.error("--out DIR (or --compare DIR_A DIR_B) is required")
    traces = os.environ.get("TRAINYARD_TRACES")
    philly = a.philly or (Path(traces) / PHILLY_FILE if traces else None)
    pollux = a.pollux or (Path(traces) / POLLUX_DIR if traces else None)
    if (philly is None and not a.no_philly) or (pollux is None and not a.no_pollux):
        ap.error("say where the traces are: --philly FILE and --pollux DIR, or TRAINYARD_TRACES=DIR")
    policies = policy_names() if a.policies == "all" else [p.strip() for p in a.policies.split(",") if p.strip()]
    todo = tasks(philly or Path(), pollux or Path(), policies,
                 [] if a.no_philly else [c.strip() for c in a.clusters.split(",") if c.strip()],
                 [s.strip() for s in a.starts.split(",") if s.strip()])
    if a.no_pollux:
        todo = [t for t in todo if t[0] != "pollux"]
    a.out.mkdir(parents=True, exist_ok=True)
    if a.resume:
        todo = [t for t in todo if not (a.out / f"{report_name(*t)}.json").exists()]
    print(f"trainyard from {Path(trainyard.__file__).parent}; {len(todo)} runs on {a.workers} workers",
          file=sys.stderr)
    t0 = time.perf_counter()
    with Pool(a.workers) as pool:
        for name, rep, secs in pool.imap_unordered(run_one, todo):
            (a.out / f"{name}.json").write_text(json.dumps(rep, indent=1, sort_keys=True) + "\n")
            print(f"{name}: {secs:.0f} s", file=sys.stderr)
    print(f"{len(todo)} reports in {a.out}, {time.perf_counter() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
