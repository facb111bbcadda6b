"""`bench/vs_slurm_sim.py`: vs_slurm's workload through the simulator, as a user runs it.

- The replay builds the very jobs `bench/vs_slurm.py` submits (same seed, sizes, classes, teams).
- Run as a script, it finishes every job, and interactive jobs (highest priority, never
  preempted, inside a 1-GPU demand) wait only the one-second cycle, as in the real run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.bench import bench_module

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "vs_slurm_sim.py"


def test_the_replay_holds_vs_slurms_jobs():
    vs_slurm, vs_slurm_sim = bench_module("vs_slurm"), bench_module("vs_slurm_sim")
    wl = vs_slurm_sim.build(1)
    real = vs_slurm.workload(60, 300.0, 1)
    assert [(j.req.id, j.req.team, j.req.job_class, j.req.min_gpus, j.duration_s) for j in wl.jobs] == \
        [(j.index, j.team, j.job_class, j.gpus, float(j.steps)) for j in real]
    assert {t: team.quota("default").nominal for t, team in wl.teams.items()} == vs_slurm.TEAMS


def test_the_script_runs_every_job():
    out = subprocess.run([sys.executable, str(SCRIPT), "--seeds", "1", "--worst", "3"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    seed, figures = out.strip().split(" ", 1)
    got = json.loads(figures)
    assert seed == "1"
    assert got["interactive"]["wait_p99_s"] <= 2.0
    assert got["training"]["wait_p99_s"] > 0 and len(got["worst_training"]) == 3
    assert got["jct_mean_s"] > 0
