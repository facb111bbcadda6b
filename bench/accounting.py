"""Benchmark: `yard report` and `yard acct` over 100,000 finished jobs (issue 18), against a plain
`SELECT count(*)` of the same rows in the same run.

    .venv/bin/python bench/accounting.py [--jobs 100000] [--reps 5] [--pg DSN] [--json]

Seeding (seed 0, straight into the store with bulk INSERTs, before anything is timed): `--jobs`
finished jobs over the 60 days before now, 4 teams × 5 users, classes training 60% / batch 30% /
interactive 10%, 1, 2, 4 or 8 GPUs (50/25/15/10%), waits up to 10 minutes, runs of 1 minute to 4
hours; a fifth have two attempts (the first preempted or crashed, with lost work), so ~120,000
attempts. States: 88% COMPLETED, 6% FAILED, 3% OUT_OF_MEMORY, 3% CANCELLED. `--ledgers`: every attempt
also has its goodput ledger stored (`attempts.ledger`, as the reconcile step stores it since issue 39:
a minute of startup, its lost work recomputed, the rest compute), so that the report adds stored
ledgers up rather than splitting each attempt from its row.

Timed, `--reps` times each, median (interleaved with the baseline):
- report: `GET /api/v1/report` over the 60 days (every job) through the real app (FastAPI's
  TestClient: routing, the service, pydantic's response model, JSON), and its baseline
  `SELECT count(*)` of the attempts joined to their jobs that the report reads;
- acct, first page: `GET /api/v1/acct/jobs` for the last 30 days with the CLI's first page
  (200 jobs): what stands between `yard acct` and its first line; the whole month paged as the
  CLI pages it (200, then 5,000 a page); baseline: `SELECT count(*)` of the month's jobs;
- on SQLite (the data dir's), and on PostgreSQL when `--pg` gives a server (a fresh database,
  dropped afterwards);
- the CLI as a user runs it, on SQLite: `yard report --json` (process start to exit) and
  `yard acct -S now-30days` to its first job line, against a real `yard up` on the data dir.

Targets: report ≤ 1 s, acct's first line ≤ 0.5 s. Prints a summary, or one JSON line with
`--json`. Reports; does not fail on a missed target.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _yard import YARD, YardServer, conditions

TEAMS = ["vision", "nlp", "speech", "robotics"]
CONFIG = """\
# bench/accounting.py: 16 emulated nodes of 8 GPUs, 4 teams of one cohort, the example's classes.
cluster:
  name: bench
  nodes:
    - {name: node, count: 16, gpus: 8, gpu_model: emulated, gpu_mem_gb: 80, block: b0, rack: r0}
teams:
""" + "".join(f"""  - name: {t}
    cohort: lab
    quotas:
      default: {{nominal: 32, borrowing_limit: 64}}
""" for t in TEAMS) + """\
classes:
  - {name: interactive, priority: 300, preemptible: false, max_wait: 15m, max_run_time: 8h, grace_period: 0}
  - {name: training, priority: 200, preemptible: true, max_wait: 24h, min_run_time: 10m, grace_period: 2m}
  - {name: batch, priority: 100, preemptible: true, max_wait: 3d, min_run_time: 0, grace_period: 1m}
default_class: training
"""
DAYS = 60


def seed(store: Any, n: int, now: float, ledgers: bool = False) -> int:
    """`n` finished jobs and their attempts (module docstring); returns the number of attempts."""
    from sqlalchemy import insert

    from trainyard.store.models import AttemptRow, JobRow

    rng = random.Random(0)
    jobs, tries = [], []
    for i in range(1, n + 1):
        team = TEAMS[i % 4]
        cls = rng.choices(["training", "batch", "interactive"], [6, 3, 1])[0]
        gpus = rng.choices([1, 2, 4, 8], [50, 25, 15, 10])[0]
        submit = now - DAYS * 86400 + rng.uniform(0, DAYS * 86400 - 6 * 3600)
        state = rng.choices(["COMPLETED", "FAILED", "OUT_OF_MEMORY", "CANCELLED"], [88, 6, 3, 3])[0]
        t, node = submit, f"node-{rng.randrange(16)}"
        n_tries = 2 if rng.random() < 0.2 else 1
        for a in range(1, n_tries + 1):
            start = t + rng.uniform(0, 600)
            end = start + rng.uniform(60, 4 * 3600)
            last = a == n_tries
            cause = {"COMPLETED": "completed", "FAILED": "crash", "OUT_OF_MEMORY": "oom",
                     "CANCELLED": "cancelled"}[state] if last else rng.choice(["preempted", "crash", "node_lost"])
            tries.append({"job_id": i, "attempt": a, "placement": [{"node": node, "gpus": list(range(gpus)),
                                                                    "mem_mib": 0}],
                          "started_at": start, "ended_at": end, "state": state if last else "PREEMPTED",
                          "reason": "", "cause": cause, "gpus": gpus,
                          "lost_gpu_s": 0.0 if cause in ("completed", "cancelled") else gpus * rng.uniform(0, 900)})
            if ledgers:
                held, lost = gpus * (end - start), tries[-1]["lost_gpu_s"]
                tries[-1]["ledger"] = {"startup": gpus * 60.0, "compute": held - gpus * 60.0 - lost,
                                       "data_wait": 0.0, "checkpoint_stall": 0.0, "comm_wait": 0.0,
                                       "recompute": lost, "idle": 0.0, "teardown": 0.0}
            t = end
        jobs.append({"id": i, "name": f"{cls[:5]}-{i}", "user": f"{team}-user{rng.randrange(5)}", "team": team,
                     "job_class": cls, "pool": "default", "state": state, "reason": "None", "held": False,
                     "command": ["sleep", "60"], "workdir": "/tmp", "env": {}, "nodes_min": 1, "nodes_max": 1,
                     "gpus": gpus, "submit_time": submit, "queued_since": submit, "eligible_time": submit,
                     "attempt": n_tries, "start_time": tries[-1]["started_at"], "end_time": t,
                     "exit_code": 0 if state == "COMPLETED" else 1, "stop_stage": 0})
    with store.session.begin() as s:
        for k in range(0, len(jobs), 5000):
            s.execute(insert(JobRow.__table__), jobs[k:k + 5000])
        for k in range(0, len(tries), 5000):
            s.execute(insert(AttemptRow.__table__), tries[k:k + 5000])
    if store.engine.dialect.name == "postgresql":
        with store.engine.connect() as c:  # the sequence past the ids given, and fresh statistics
            from sqlalchemy import text

            c.execute(text("SELECT setval('jobs_id_seq', (SELECT max(id) FROM jobs))"))
            c.execute(text("ANALYZE"))
            c.commit()
    return len(tries)


def time_it(fn: Any, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def in_process(url: str | None, data_dir: Path, n: int, reps: int, ledgers: bool = False) -> dict[str, Any]:
    """The API and baseline timings on one store (SQLite in `data_dir`, or the PostgreSQL `url`)."""
    from fastapi.testclient import TestClient
    from sqlalchemy import func, or_, select

    from trainyard.api.app import create_app
    from trainyard.control.lifecycle.plane_builder import PlaneSettings, build_plane
    from trainyard.store.models import AttemptRow, JobRow

    now = time.time()
    cp = build_plane(PlaneSettings(data_dir, db_url=url, config_text=CONFIG))
    try:
        t0 = time.perf_counter()
        attempts = seed(cp.store, n, now, ledgers)
        seed_s = time.perf_counter() - t0
        http = TestClient(create_app(cp))
        http.headers["Authorization"] = f"Bearer {(cp.data_dir / 'admin.token').read_text().strip()}"
        start, end = now - DAYS * 86400, now
        month = now - 30 * 86400

        def report() -> None:
            r = http.get("/api/v1/report", params={"start": f"@{start}", "end": f"@{end}"})
            assert r.status_code == 200, r.text

        def report_rows() -> None:
            with cp.store.session() as s:
                s.scalar(select(func.count()).select_from(AttemptRow).join(JobRow, JobRow.id == AttemptRow.job_id)
                         .where(AttemptRow.started_at < end,
                                or_(AttemptRow.ended_at.is_(None), AttemptRow.ended_at > start)))

        def first_page() -> None:
            r = http.get("/api/v1/acct/jobs", params={"starttime": f"@{month}", "endtime": f"@{end}", "limit": 200})
            assert r.status_code == 200 and len(r.json()["jobs"]) == 200, r.text

        paged = [0]

        def whole_month() -> None:
            after, limit, got = 0, 200, 0
            while True:
                r = http.get("/api/v1/acct/jobs", params={"starttime": f"@{month}", "endtime": f"@{end}",
                                                           "limit": limit, "after": after}).json()
                got += len(r["jobs"])
                if r["next_after"] is None:
                    break
                after, limit = r["next_after"], 5000
            paged[0] = got

        def month_rows() -> None:
            with cp.store.session() as s:
                s.scalar(select(func.count()).select_from(JobRow).where(
                    JobRow.submit_time <= end, or_(JobRow.end_time.is_(None), JobRow.end_time >= month)))

        report(), first_page()  # warm: the configuration cache, the first connections
        t = {k: [] for k in ("report", "report_count", "acct_first_page", "month_count")}
        for _ in range(reps):  # interleaved, so that load hits each alike
            t["report"] += time_it(report, 1)
            t["report_count"] += time_it(report_rows, 1)
            t["acct_first_page"] += time_it(first_page, 1)
            t["month_count"] += time_it(month_rows, 1)
        whole = time_it(whole_month, max(1, reps // 2))
        with cp.store.session() as s:
            rows = s.scalar(select(func.count()).select_from(AttemptRow).join(JobRow, JobRow.id == AttemptRow.job_id)
                            .where(AttemptRow.started_at < end, or_(AttemptRow.ended_at.is_(None),
                                                                   AttemptRow.ended_at > start)))
        med = {k: statistics.median(v) for k, v in t.items()}
        return {"store": cp.store.engine.dialect.name, "jobs": n, "attempts": attempts, "seed_s": round(seed_s, 1),
                "report_rows": rows, "month_jobs": paged[0],
                "report_s": round(med["report"], 3), "report_count_s": round(med["report_count"], 4),
                "report_ratio": round(med["report"] / med["report_count"], 1),
                "acct_first_page_s": round(med["acct_first_page"], 3), "month_count_s": round(med["month_count"], 4),
                "acct_first_page_ratio": round(med["acct_first_page"] / med["month_count"], 1),
                "acct_whole_month_s": round(statistics.median(whole), 2)}
    finally:
        cp.stop()


def cli(data_dir: Path, reps: int) -> dict[str, Any]:
    """`yard report --json` and `yard acct`'s first line, as a user runs them, against `yard up`."""
    server = YardServer(data_dir=data_dir).start()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("YARD_", "TRAINYARD_"))},
           "YARD_URL": server.url, "YARD_TOKEN": server.token}
    try:
        rep, first, floor = [], [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            subprocess.run([YARD, "report", "-S", f"now-{DAYS}days", "--json"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            rep.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            p = subprocess.Popen([YARD, "acct", "-S", "now-30days"], env=env, stdout=subprocess.PIPE, text=True)
            assert p.stdout is not None
            p.stdout.readline(), p.stdout.readline()  # header and its rule
            line = p.stdout.readline()
            first.append(time.perf_counter() - t0)
            assert line.strip(), "no job line"
            p.kill()
            p.wait()
            t0 = time.perf_counter()
            subprocess.run([YARD, "--help"], env=env, check=True, stdout=subprocess.DEVNULL)
            floor.append(time.perf_counter() - t0)
        return {"cli_report_s": round(statistics.median(rep), 3), "cli_acct_first_line_s":
                round(statistics.median(first), 3), "cli_start_floor_s": round(statistics.median(floor), 3)}
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pg", default=None, help="libpq DSN of a PostgreSQL server (e.g. host=127.0.0.1 user=postgres "
                                               "dbname=test); a fresh database is made there and dropped")
    ap.add_argument("--no-cli", action="store_true", help="skip the yard up / CLI part")
    ap.add_argument("--ledgers", action="store_true", help="store every attempt's goodput ledger (issue 39)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out: dict[str, Any] = {"conditions": conditions(), "results": []}
    with tempfile.TemporaryDirectory(prefix="yard-acct-bench-") as tmp:
        sqlite_dir = Path(tmp) / "sqlite"
        out["results"].append(in_process(None, sqlite_dir, a.jobs, a.reps, a.ledgers))
        if not a.no_cli:
            out["results"][0].update(cli(sqlite_dir, a.reps))
        if a.pg:
            import psycopg
            from psycopg import sql

            admin = psycopg.connect(a.pg, autocommit=True)
            name = f"yard_bench_{uuid.uuid4().hex[:8]}"
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            try:
                info = admin.info
                url = f"postgresql://{info.user}@{info.host}:{info.port}/{name}"
                out["results"].append(in_process(url, Path(tmp) / "pg", a.jobs, a.reps, a.ledgers))
            finally:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
                admin.close()
    if a.json:
        print(json.dumps(out))
        return
    print(f"conditions: {out['conditions']}")
    for r in out["results"]:
        print(json.dumps(r, indent=1))


if __name__ == "__main__":
    sys.exit(main())
