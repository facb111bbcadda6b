"""Benchmark: what `--dependency` costs the control loop on every pass, with a big queue.

    .venv/bin/python bench/dependencies.py [--jobs 10000] [--waiting 100] [--reps 30] [--json]

A `ControlPlane` on a fresh temporary data dir (SQLite; the loop is not started) stores `--jobs`
pending jobs without a dependency, as the API would. Timed, `--reps` times each, interleaved,
median: the loop's dependency step (`control.loop.dependencies.settle`, in its own transaction,
as the loop runs it), and as the baseline the read of the waiting jobs that the loop's schedule
step makes on every pass anyway (`PENDING_COLUMNS` of the pending, not held, not waiting rows).
Then `--waiting` jobs that wait on a dependency no job will meet soon (`afterok` on a pending job)
are added and both are timed again: the step reads and judges each of them on every pass.
Prints a summary, or with `--json` one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from _yard import IDENTITY
from sqlalchemy import or_, select

from trainyard.control.loop import dependencies
from trainyard.control.loop.schedule import PENDING_COLUMNS
from trainyard.control.lifecycle.plane import ControlPlane
from trainyard.control.lifecycle.plane_builder import PlaneSettings, build_plane
from trainyard.services import jobs
from trainyard.services.auth import Principal
from trainyard.states import PENDING_STATES
from trainyard.store.models import JobRow

CONFIG = """
cluster:
  name: bench
  nodes:
    - {name: node, count: 4, gpus: 8, gpu_model: emulated, gpu_mem_gb: 80}
teams:
  - name: lab
    quotas:
      default: {nominal: 32}
classes:
  - {name: training, priority: 200, preemptible: true, max_wait: 24h}
default_class: training
"""
ADMIN = Principal("admin", "admin")


def pending_read(cp: ControlPlane, now: float) -> float:
    t = JobRow.__table__
    with cp.store.session() as s:
        t0 = time.perf_counter()
        s.execute(select(*(t.c[c] for c in PENDING_COLUMNS))
                  .where(t.c.state.in_(PENDING_STATES), t.c.held.is_(False), t.c.dependency_pending.is_(False),
                         or_(t.c.retry_after.is_(None), t.c.retry_after <= now)).order_by(t.c.id)).all()
        return time.perf_counter() - t0


def settle(cp: ControlPlane, now: float) -> float:
    t0 = time.perf_counter()
    with cp.store.session.begin() as s:
        dependencies.settle(s, now)
    return time.perf_counter() - t0


def measure(cp: ControlPlane, reps: int) -> dict[str, float]:
    a, b = [], []
    for _ in range(reps):
        now = time.time()
        a.append(settle(cp, now))
        b.append(pending_read(cp, now))
    return {"settle_ms": statistics.median(a) * 1000, "pending_read_ms": statistics.median(b) * 1000}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--waiting", type=int, default=100)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cp = build_plane(PlaneSettings(Path(tmp) / "yard", config_text=CONFIG, **IDENTITY))
        try:
            wd = str(cp.data_dir)
            with cp.store.session.begin() as s:
                cfg = cp.configs.current(s)
                for _ in range(a.jobs):
                    jobs.submit(s, jobs.JobSubmit(command=["sleep", "600"], workdir=wd), ADMIN, cfg, cp.data_dir)
            plain = measure(cp, a.reps)
            with cp.store.session.begin() as s:
                cfg = cp.configs.current(s)
                for i in range(a.waiting):
                    jobs.submit(s, jobs.JobSubmit(command=["true"], workdir=wd, dependency=f"afterok:{i + 1}"),
                                ADMIN, cfg, cp.data_dir)
            waiting = measure(cp, a.reps)
        finally:
            cp.stop()
    out = {"jobs": a.jobs, "waiting": a.waiting, "reps": a.reps,
           "none_waiting": plain, "with_waiting": waiting,
           "ratio_none_waiting": plain["settle_ms"] / plain["pending_read_ms"],
           "ratio_with_waiting": waiting["settle_ms"] / waiting["pending_read_ms"]}
    if a.json:
        print(json.dumps(out))
    else:
        for label, m, r in (("no job waits on a dependency", plain, out["ratio_none_waiting"]),
                            (f"{a.waiting} wait on one", waiting, out["ratio_with_waiting"])):
            print(f"{a.jobs} pending, {label}: dependency step {m['settle_ms']:.2f} ms per pass; "
                  f"the pending read the loop makes anyway {m['pending_read_ms']:.2f} ms ({r:.3f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
