"""Benchmark: job submissions over real HTTP to a real `yard up` process on SQLite.

    .venv/bin/python bench/submit_http.py [--jobs 1000] [--clients 4] [--nodes 2 --gpus-per-node 4] [--json]

Four runs, each on a fresh `yard up` (fresh temporary data dir, SQLite, `--port 0`, an emulated
cluster of 2 x 4 GPUs, control loop running as in production):

- held, 1 client / held, N clients: every submission has `hold: true`, so nothing starts; the
  loop still wakes on each submission (the API wakes it) and reads the queue;
- unheld, 1 client / unheld, N clients: the jobs are eligible; the loop schedules them while
  they arrive, starts the first ones that fit (8 GPUs: real rank processes running
  `sleep 600`) and writes a reason and an estimated start for each pending job on every pass.

Each client is a thread with its own keep-alive `httpx.Client` and the admin token; it first
sends 10 `GET /api/v1/whoami` (connection and code paths warm), then all clients take jobs from
one shared list until `--jobs` are submitted. Latency is per request (send to parsed response),
throughput is jobs / wall time from the first to the last submission. Jobs: `sleep 600`, class
training (the default), time limit 2h, GPUs 1,1,1,1,1,1,2,4 in turn, one env variable each.

Clients and server share this machine's cores: the figures include the client's own CPU time.
After each run the server is stopped with SIGTERM; the ranks it leaves running (by design,
`yard up` leaves running jobs to be re-attached) are killed by releasing their attempts through a
`LocalBackend` on the data dir, and processes naming the data dir are counted (0 expected).

Prints a summary, or with `--json` one JSON line. Reports; does not fail on a missed target.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

from _yard import YardServer, conditions, latency_summary

TARGET = {"jobs_per_s": 200, "p99_ms": 50}
GPUS = [1, 1, 1, 1, 1, 1, 2, 4]


def job_body(i: int, held: bool, workdir: str) -> dict[str, Any]:
    return {"name": f"bench-{i}", "command": ["sleep", "600"], "gpus": GPUS[i % len(GPUS)], "time": "2h",
            "env": {"BENCH_INDEX": str(i)}, "workdir": workdir, "hold": held}


def run_one(args: argparse.Namespace, held: bool, clients: int) -> dict[str, Any]:
    srv = YardServer(nodes=args.nodes, gpus_per_node=args.gpus_per_node, keep=args.keep).start()
    try:
        bodies = [job_body(i, held, str(srv.data_dir)) for i in range(args.jobs)]
        nxt = iter(range(args.jobs))
        take = threading.Lock()
        lat: list[list[float]] = [[] for _ in range(clients)]
        errors: list[str] = []
        barrier = threading.Barrier(clients + 1)

        def worker(k: int) -> None:
            with srv.client() as c:
                for _ in range(10):
                    c.get("/api/v1/whoami").raise_for_status()
                barrier.wait()
                while True:
                    with take:
                        i = next(nxt, None)
                    if i is None:
                        return
                    t0 = time.perf_counter()
                    r = c.post("/api/v1/jobs", json=bodies[i])
                    r.json()
                    lat[k].append((time.perf_counter() - t0) * 1000)
                    if r.status_code != 201:
                        errors.append(f"{r.status_code} {r.text[:200]}")

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        steps0 = srv.health()["loop"]["steps"]
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        loop = srv.health()["loop"]
        with srv.client() as c:
            running = len(c.get("/api/v1/jobs", params={"state": "RUNNING,COMPLETING"}).json()["jobs"])
        ms = [x for per in lat for x in per]
        res = {"held": held, "clients": clients, "jobs": len(ms), "errors": len(errors),
               "first_error": errors[0] if errors else None,
               "jobs_per_s": round(len(ms) / wall, 1), "wall_s": round(wall, 2), **latency_summary(ms),
               "loop_passes_during_run": loop["steps"] - steps0, "loop_last_pass_ms": loop["last_step_ms"],
               "loop_errors": loop["errors"], "loop_last_error": loop["last_error"][:300] or None, "jobs_running_at_end": running, "server_startup_s": srv.startup_s}
    finally:
        res_stop = srv.stop()
    res.update(res_stop)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=4, help="concurrent client threads of the concurrent runs")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--only", choices=["held", "unheld", "both"], default="both")
    ap.add_argument("--keep", action="store_true", help="keep the data dirs (printed in the log)")
    ap.add_argument("--json", action="store_true", help="one JSON line")
    args = ap.parse_args()
    before = conditions()
    runs = []
    for held in {"held": [True], "unheld": [False], "both": [True, False]}[args.only]:
        for clients in (1, args.clients):
            runs.append(run_one(args, held, clients))
    after = conditions()
    out = {"bench": "submit_http", "store": "sqlite", "cluster": f"{args.nodes}x{args.gpus_per_node}",
           "target": TARGET, "conditions_before": before, "conditions_after": after, "runs": runs}
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.jobs} submissions over HTTP, SQLite, {args.nodes}x{args.gpus_per_node} GPUs; "
          f"load {before['load1']}, 1M-loop calibration {before['calibration_1m_loop_ms']} ms before / "
          f"{after['calibration_1m_loop_ms']} ms after")
    print(f"{'run':<18} {'jobs/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} {'loop passes':>12} "
          f"{'running':>8} {'errors':>7} {'left':>5}")
    for r in runs:
        name = f"{'held' if r['held'] else 'unheld'}, {r['clients']} client{'s' if r['clients'] > 1 else ''}"
        print(f"{name:<18} {r['jobs_per_s']:>8} {r['p50_ms']:>8} {r['p95_ms']:>8} {r['p99_ms']:>8} {r['max_ms']:>8} "
              f"{r['loop_passes_during_run']:>12} {r['jobs_running_at_end']:>8} {r['errors']:>7} "
              f"{r['leftover_processes']:>5}")
    print(f"target: >= {TARGET['jobs_per_s']} jobs/s with p99 <= {TARGET['p99_ms']} ms")


if __name__ == "__main__":
    main()
