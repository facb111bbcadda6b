"""Benchmark: the lifecycle rules' bookkeeping over many finished jobs (issue 41): what `yard
storage` computes for "what the rules delete next", and one pass of the retention thread that
finds nothing due, against a plain `SELECT count(*)` of the same rows in the same run.

    .venv/bin/python bench/storage_rules.py [--jobs 10000] [--steps 10] [--reps 5] [--json]

Seeding (before anything is timed; straight into a fresh plane's SQLite store, no loop running):
`--jobs` finished jobs of 4 teams and 2 classes, each with `--steps` checkpoint copies in the fast
tier (the rows the tiers thread keeps), ended over the 30 days before now; rules keep-last-2 +
every-5th for the cluster, a team and a class with rules of their own, logs 90 days and job dirs
180 days (nothing is due: the pass only looks).

Timed, `--reps` times each, median, interleaved with the baseline:
- next: `services.storage_view.next_deletions` (the checkpoint plan of every job with copies, and
  the due dates of the job dirs the meter knows: here every job's), as `GET /api/v1/storage` runs it;
- pass: `Retention.run_once()` from a fresh cursor (a restarted plane's first pass);
- baseline: `SELECT count(*)` of the checkpoint copies joined to their jobs.
Prints a summary, or one JSON line with `--json`.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import func, insert, select, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _yard import conditions  # noqa: E402

from trainyard.control.lifecycle.plane_builder import PlaneSettings, build_plane  # noqa: E402
from trainyard.services import storage_view  # noqa: E402
from trainyard.store.models import CheckpointCopyRow, JobRow  # noqa: E402

TEAMS = ["vision", "nlp", "speech", "robotics"]
CONFIG = """\
cluster:
  name: bench
  nodes:
    - {name: node, count: 2, gpus: 8, gpu_model: emulated, gpu_mem_gb: 80, block: b0, rack: r0}
teams:
""" + "".join(f"""  - name: {t}
    cohort: lab
    quotas:
      default: {{nominal: 8, borrowing_limit: 8}}
""" + ("    storage: {lifecycle: {checkpoints: {keep_last: 3}, logs: 30d}}\n" if t == "nlp" else "")
    for t in TEAMS) + """\
classes:
  - {name: training, priority: 200, preemptible: true, max_wait: 24h, min_run_time: 0, grace_period: 3}
  - {name: batch, priority: 100, preemptible: true, max_wait: 3d, min_run_time: 0, grace_period: 2,
     lifecycle: {checkpoints: {keep_every: 10}}}
default_class: training
storage:
  lifecycle: {checkpoints: {keep_last: 2, keep_every: 5}, logs: 90d, job_dirs: 180d}
"""


def seed(cp: Any, jobs: int, steps: int, now: float) -> None:
    rng = random.Random(0)
    with cp.store.session.begin() as s:
        first = (s.scalar(select(func.max(JobRow.id))) or 0) + 1
        rows, copies = [], []
        for i in range(jobs):
            end = now - rng.uniform(0, 30 * 86400)
            jid = first + i
            rows.append(dict(id=jid, name=f"j{i}", user="u", team=TEAMS[i % 4],
                             job_class="batch" if i % 3 == 0 else "training", pool="default", state="COMPLETED",
                             reason="None", command=["true"], workdir="/tmp", env={}, gpus=1,
                             submit_time=end - 3600, queued_since=end - 3600, end_time=end, start_time=end - 1800,
                             attempt=1, dir_key=f"{jid:012x}"))
            copies += [dict(job_id=jid, step=k, tier="fast", bytes=1 << 20, files=2, at=end, location="",
                            metrics={"loss": rng.random()}) for k in range(1, steps + 1)]
        s.execute(insert(JobRow), rows)
        for i in range(0, len(copies), 10_000):
            s.execute(insert(CheckpointCopyRow), copies[i:i + 10_000])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cp = build_plane(PlaneSettings(Path(tmp) / "yard", config_text=CONFIG))
        try:
            now = time.time()
            seed(cp, a.jobs, a.steps, now)
            with cp.store.session() as s:
                spec = cp.configs.current(s).spec
                dirs = [{"job_id": jid, "apparent_bytes": 1 << 30, "kinds": {"logs": 1 << 20}}
                        for jid in s.scalars(select(JobRow.id))]
            times: dict[str, list[float]] = {"next": [], "pass": [], "baseline": []}
            deletions = 0
            for _ in range(a.reps):
                with cp.store.session() as s:
                    t0 = time.perf_counter()
                    nxt = storage_view.next_deletions(s, spec, dirs, now, 20)
                    times["next"].append(time.perf_counter() - t0)
                    deletions = len(nxt)
                    t0 = time.perf_counter()
                    s.execute(text("SELECT count(*) FROM checkpoint_copies c JOIN jobs j ON j.id = c.job_id")).scalar()
                    times["baseline"].append(time.perf_counter() - t0)
                cp.retention._dirs_cursor, cp.retention._cursor_version = 0, None
                t0 = time.perf_counter()
                cp.retention.run_once()
                times["pass"].append(time.perf_counter() - t0)
        finally:
            cp.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"jobs": a.jobs, "copies": a.jobs * a.steps, "next_s": round(med["next"], 4),
           "pass_s": round(med["pass"], 4), "baseline_s": round(med["baseline"], 4), "listed": deletions,
           "deleted": cp.retention.deleted, **conditions()}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"{a.jobs} finished jobs, {a.jobs * a.steps} checkpoint copies: next deletions {med['next'] * 1000:.0f} ms "
              f"(listed {deletions}), a retention pass {med['pass'] * 1000:.0f} ms, "
              f"baseline count(*) {med['baseline'] * 1000:.1f} ms (median of {a.reps}); {conditions()}")


if __name__ == "__main__":
    main()
