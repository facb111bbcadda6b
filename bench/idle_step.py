"""Benchmark: what a class's idle policy costs the control loop on every pass, with many running jobs.

    .venv/bin/python bench/idle_step.py [--jobs 1000] [--passes 60] [--json]

A `ControlPlane` on the fake backend and a fake clock (the ranks are scripted; the store, the loop
and its steps are the real ones), `--jobs` nodes' worth of 1-GPU jobs running (8 GPUs a node),
half of them busy (50% of a CPU), half idle, all of class `training` with `idle: {after: 30m,
action: requeue}` (no job reaches `after` during the run). Then `--passes` loop passes, a fake
second apart: each pass's idle step (`control/loop/idle.py`: the read of the running jobs, each
job's CPU and GPU read every 5 s, the judgement) and the whole pass are timed
(`LoopStats.last_phases`). Prints the median and the largest of each, or with `--json` one JSON
line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from _yard import IDENTITY

from trainyard.backends.base import NodeInfo
from trainyard.backends.fake import FakeBackend
from trainyard.clock import FakeClock
from trainyard.control.lifecycle.plane_builder import PlaneSettings, build_plane
from trainyard.services import jobs
from trainyard.services.auth import Principal
from trainyard.spec.models import parse_config
from trainyard.store.models import JobRow

CONFIG = """
cluster:
  name: bench
  nodes:
    - {{name: node, count: {nodes}, gpus: 8, gpu_model: emulated, gpu_mem_gb: 80}}
teams:
  - name: lab
    quotas:
      default: {{nominal: {gpus}}}
classes:
  - {{name: training, priority: 200, preemptible: true, max_wait: 24h, idle: {{after: 30m, action: requeue}}}}
default_class: training
"""
ADMIN = Principal("admin", "admin")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--passes", type=int, default=60)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    nodes = -(-a.jobs // 8)
    text = CONFIG.format(nodes=nodes, gpus=nodes * 8)
    clock = FakeClock(start=time.time())
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "yard"
        data.mkdir()
        infos = [NodeInfo(n.name, n.gpus, n.gpu_model, n.gpu_mem_mib) for n in parse_config(text).cluster.expand()]
        backend = FakeBackend(data, infos, clock=clock)
        cp = build_plane(PlaneSettings(data, config_text=text, backend=backend, clock=clock, **IDENTITY))
        try:
            wd = str(cp.data_dir)
            with cp.store.session.begin() as s:
                cfg = cp.configs.current(s)
                for _ in range(a.jobs):
                    jobs.submit(s, jobs.JobSubmit(command=["yard-fake"], workdir=wd, gpus=1), ADMIN, cfg, cp.data_dir)
            for _ in range(50):
                clock.advance(1)
                cp.loop.step()
                with cp.store.session() as s:
                    running = s.query(JobRow).filter(JobRow.state == "RUNNING").count()
                if running == a.jobs:
                    break
            assert running == a.jobs, f"only {running} of {a.jobs} running"
            for jid in range(1, a.jobs + 1, 2):
                backend.set_usage(jid, 1, cpu_percent=50)
            idle, whole = [], []
            for _ in range(a.passes):
                clock.advance(1)
                cp.loop.step()
                phases = cp.loop.stats.last_phases
                idle.append(phases["idle"] * 1000)
                whole.append(sum(phases.values()) * 1000)
        finally:
            cp.stop()
    out = {"jobs": a.jobs, "passes": a.passes, "idle_ms_median": statistics.median(idle), "idle_ms_max": max(idle),
           "pass_ms_median": statistics.median(whole), "pass_ms_max": max(whole),
           "share_median": statistics.median(i / w for i, w in zip(idle, whole))}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"{a.jobs} running jobs under an idle policy, {a.passes} passes a fake second apart: idle step "
              f"{out['idle_ms_median']:.1f} ms median, {out['idle_ms_max']:.1f} ms max; whole pass "
              f"{out['pass_ms_median']:.1f} ms median, {out['pass_ms_max']:.1f} ms max; "
              f"the step's share of a pass {out['share_median']:.1%} (median)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
