"""Benchmark: `yard queue` end to end with 10,000 jobs stored, against a real `yard up` on SQLite.

    .venv/bin/python bench/queue_10k.py [--jobs 10000] [--reps 7] [--json]

Seeding (fast path, before the server starts): a `ControlPlane` on a fresh temporary data dir
(SQLite) with the configuration below (4 emulated nodes x 8 GPUs, 4 teams of one cohort, the
example's three classes), then `services.jobs.submit` for every job in one transaction, as the API
would store them, with submit times spread over the last two days (seed 0). Of 10,000 jobs:
15% finished (10% COMPLETED, 2.5% FAILED, 2.5% CANCELLED, with their attempt rows) and 85%
PENDING, a tenth of those held. Shapes: 1 GPU (60%), 2 (20%), 4 (12%), 8 (6%), 2 nodes x 8 (2%);
classes training 60%, batch 30%, interactive 10%; 4 teams x 5 users; every command `sleep 600`.

Then `yard up` runs on that data dir with its control loop: it schedules what fits on the 32
GPUs (real `sleep 600` ranks) and gives every other pending job a reason and an estimated start,
pass after pass, while the queue is read; the benchmark waits until the loop has made two passes
and the number of running jobs has been steady for 3 s. So `yard queue` (pending + running, what
`squeue` shows) lists about 8,500 jobs: the hard case.

Timed, `--reps` times each (interleaved, in a random order, each after a random pause of up to 1 s,
so that the measurements fall anywhere in the loop's pass/pause cycle), median and max:
- `yard queue`: the command as a user runs it (`.venv/bin/yard queue` as a subprocess with
  YARD_URL and YARD_TOKEN set, stdout into a pipe), interpreter start to exit;
- `yard queue --json`: the same, JSON output;
- the API call alone: `GET /api/v1/jobs?active=true` on a fresh httpx connection, as the CLI makes
  it, to the parsed response;
- `yard --help`: the CLI's start-up floor (interpreter, imports), for the breakdown.

Teardown as in `submit_http.py`: SIGTERM, then the ranks left running are killed through a
`LocalBackend` on the data dir; `leftover_processes` (0 expected) is reported.
Prints a summary, or with `--json` one JSON line. Reports; does not fail on a missed target.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from _yard import IDENTITY, YARD, YardServer, conditions

TARGET_S = 1.0
TEAMS = ["vision", "nlp", "speech", "robotics"]
CONFIG = """\
# bench/queue_10k.py: 4 emulated nodes of 8 GPUs, 4 teams of one cohort, the example's classes.
cluster:
  name: bench
  nodes:
    - {name: node, count: 4, gpus: 8, gpu_model: emulated, gpu_mem_gb: 80, block: b0, rack: r0}
teams:
""" + "".join(f"""  - name: {t}
    cohort: lab
    quotas:
      default: {{nominal: 8, borrowing_limit: 24}}
""" for t in TEAMS) + """\
classes:
  - {name: interactive, priority: 300, preemptible: false, max_wait: 15m, max_run_time: 8h, grace_period: 0}
  - {name: training, priority: 200, preemptible: true, max_wait: 24h, min_run_time: 10m, grace_period: 2m}
  - {name: batch, priority: 100, preemptible: true, max_wait: 3d, min_run_time: 0, grace_period: 1m}
default_class: training
"""


def seed(data_dir: Path, n: int) -> dict[str, Any]:
    """Store `n` jobs through `services.jobs.submit` (one transaction); returns the state counts."""
    from trainyard.control.lifecycle.plane_builder import PlaneSettings, build_plane
    from trainyard.services import jobs
    from trainyard.services.auth import Principal
    from trainyard.store.models import AttemptRow

    rng = random.Random(0)
    cp = build_plane(PlaneSettings(data_dir, config_text=CONFIG, **IDENTITY))
    counts: dict[str, int] = {}
    now = time.time()
    try:
        with cp.lock, cp.store.session.begin() as s:
            cfg = cp.configs.current(s)
            for i in range(n):
                team = TEAMS[i % len(TEAMS)]
                by = Principal(f"{team}-user{rng.randrange(5)}", "member", team)
                cls = rng.choices(["training", "batch", "interactive"], [6, 3, 1])[0]
                shape = rng.choices([{"gpus": 1}, {"gpus": 2}, {"gpus": 4}, {"gpus": 8},
                                     {"nodes": 2, "gpus_per_node": 8}], [60, 20, 12, 6, 2])[0]
                r = rng.random()
                state = "COMPLETED" if r < 0.10 else "FAILED" if r < 0.125 else "CANCELLED" if r < 0.15 else "PENDING"
                held = state == "PENDING" and rng.random() < 0.1
                sub = jobs.JobSubmit(name=f"{cls[:5]}-{i}", team=team, job_class=cls, command=["sleep", "600"],
                                     time=rng.choice(["30m", "2h", "8h"]), workdir=str(cp.data_dir),
                                     env={"SEED": str(i)}, hold=held, **shape)
                row = jobs.submit(s, sub, by, cfg, cp.data_dir)
                row.submit_time = row.queued_since = now - rng.uniform(60, 2 * 86400)
                if state in ("COMPLETED", "FAILED"):
                    start = row.submit_time + rng.uniform(0, 3600)
                    end = min(now - 1, start + rng.uniform(60, 4 * 3600))
                    placement = [{"node": f"node{k}", "gpus": list(range(row.gpus_per_node or row.gpus)),
                                  "mem_mib": 0} for k in range(row.nodes_min)]
                    code = 0 if state == "COMPLETED" else 1
                    row.state, row.reason, row.attempt = state, "None" if code == 0 else "NonZeroExitCode", 1
                    row.start_time, row.end_time, row.placement, row.exit_code = start, end, placement, code
                    s.add(AttemptRow(job_id=row.id, attempt=1, placement=placement, started_at=start, ended_at=end,
                                     state=state, exit_code=code, reason=row.reason))
                elif state == "CANCELLED":
                    row.state, row.reason, row.end_time = state, f"CancelledBy:{by.user}", row.submit_time + 600
                key = "PENDING (held)" if held else state
                counts[key] = counts.get(key, 0) + 1
    finally:
        cp.stop()
    return counts


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {done.returncode}: {done.stderr.decode()[-500:]}")
    return dt, len(done.stdout)


def summary(xs: list[float]) -> dict[str, float]:
    return {"median_s": round(statistics.median(xs), 3), "max_s": round(max(xs), 3), "min_s": round(min(xs), 3)}


def wait_settled(srv: YardServer, timeout: float = 180.0) -> dict[str, Any]:
    """Until the loop has made two passes and the number of running jobs is steady for 3 s."""
    t0 = time.monotonic()
    first = srv.health()["loop"]
    base = first["steps"] + first["errors"]
    last, since = -1, time.monotonic()
    with srv.client() as c:
        while time.monotonic() - t0 < timeout:
            loop = srv.health()["loop"]
            running = len(c.get("/api/v1/jobs", params={"state": "RUNNING,COMPLETING"}).json()["jobs"])
            if running != last:
                last, since = running, time.monotonic()
            if loop["steps"] + loop["errors"] >= base + 2 and time.monotonic() - since >= 3:
                break
            time.sleep(0.5)
    return {"settle_s": round(time.monotonic() - t0, 1), "running": last}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--keep", action="store_true", help="keep the data dir")
    ap.add_argument("--json", action="store_true", help="one JSON line")
    args = ap.parse_args()
    before = conditions()
    srv = YardServer(config=None, keep=args.keep)
    t0 = time.perf_counter()
    counts = seed(srv.data_dir, args.jobs)
    seed_s = time.perf_counter() - t0
    (srv.data_dir / "cluster.yaml").write_text(CONFIG)
    srv.args += ["--config", str(srv.data_dir / "cluster.yaml")]
    out: dict[str, Any] = {"bench": "queue_10k", "store": "sqlite", "cluster": "4x8", "jobs": args.jobs,
                           "seeded": counts, "seed_s": round(seed_s, 1), "target_s": TARGET_S}
    try:
        srv.start()
        out["server_startup_s"] = srv.startup_s
        out.update(wait_settled(srv))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("YARD_", "TRAINYARD_"))}
        env.update(YARD_URL=srv.url, YARD_TOKEN=srv.token)
        with srv.client() as c:
            active = c.get("/api/v1/jobs", params={"active": "true"}).json()["jobs"]
        out["listed"] = len(active)
        out["listed_running"] = sum(j["state"] in ("RUNNING", "COMPLETING") for j in active)
        floor = [timed([YARD, "--help"], env)[0] for _ in range(3)]
        times: dict[str, list[float]] = {"table": [], "json": [], "api": []}
        size: dict[str, int] = {}

        def api_call() -> tuple[float, int]:
            t1 = time.perf_counter()
            with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {srv.token}"}, timeout=60) as c:
                r = c.get("/api/v1/jobs", params={"active": "true"})
                r.raise_for_status()
                r.json()
            return time.perf_counter() - t1, len(r.content)

        run = {"table": lambda: timed([YARD, "queue"], env), "json": lambda: timed([YARD, "queue", "--json"], env),
               "api": api_call}
        rng = random.Random(1)
        for _ in range(args.reps):
            # Interleaved, in a random order after a random pause: a user's command arrives at any
            # point of the loop's pass/pause cycle, and a burst of load should hit all three alike.
            for what in rng.sample(sorted(run), len(run)):
                time.sleep(rng.uniform(0, 1.0))
                dt, size[what] = run[what]()
                times[what].append(dt)
        table, js, api = times["table"], times["json"], times["api"]
        table_bytes, js_bytes, api_bytes = size["table"], size["json"], size["api"]
        loop = srv.health()["loop"]
        out.update({
            "yard_queue": {**summary(table), "stdout_bytes": table_bytes},
            "yard_queue_json": {**summary(js), "stdout_bytes": js_bytes},
            "api_list_active": {**summary(api), "response_bytes": api_bytes},
            "yard_help_floor": summary(floor),
            "loop_last_pass_ms": loop["last_step_ms"], "loop_passes": loop["steps"], "loop_errors": loop["errors"],
            "loop_last_error": loop["last_error"][:300] or None,
        })
    finally:
        out.update(srv.stop())
    out["conditions_before"], out["conditions_after"] = before, conditions()
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.jobs} jobs stored ({counts}); `yard queue` lists {out.get('listed')} "
          f"({out.get('listed_running')} running); load {before['load1']}, 1M-loop calibration "
          f"{before['calibration_1m_loop_ms']} ms before / {out['conditions_after']['calibration_1m_loop_ms']} ms after")
    for key, label in (("yard_queue", "yard queue"), ("yard_queue_json", "yard queue --json"),
                       ("api_list_active", "GET /api/v1/jobs?active=true"), ("yard_help_floor", "yard --help")):
        if key in out:
            print(f"{label:<30} median {out[key]['median_s']:.3f} s  max {out[key]['max_s']:.3f} s")
    print(f"loop: last pass {out.get('loop_last_pass_ms')} ms, {out.get('loop_passes')} passes, "
          f"{out.get('loop_errors')} failed; leftover processes {out['leftover_processes']}")
    print(f"target: yard queue <= {TARGET_S} s")


if __name__ == "__main__":
    main()
