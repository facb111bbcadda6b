"""`bench/vs_slurm_frontier.py`: the training tail of vs_slurm's workload against the quota gaps.

- The gaps it reports tell the two kinds of schedule apart: trainyard as configured keeps every
  team within 0.05 of what its quota lets it hold; the same engine with no quota does not.
- Run as a script, it prints one row per variant.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.bench import bench_module

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "vs_slurm_frontier.py"


def test_gaps_tell_quota_keeping_from_not():
    f = bench_module("vs_slurm_frontier")
    by_name = {v.name: v for v in f.VARIANTS}
    kept = f.run(1, by_name["trainyard"])
    free = f.run(1, by_name["trainyard, no quota"])
    assert kept["unfinished"] == free["unfinished"] == 0
    assert max(kept["gaps"].values()) <= 0.05
    assert max(free["gaps"].values()) > 0.05


def test_the_script_prints_every_variant():
    out = subprocess.run([sys.executable, str(SCRIPT), "--seeds", "1"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    rows = out.strip().splitlines()
    assert len(rows) == 1 + len(bench_module("vs_slurm_frontier").VARIANTS)
    assert rows[1].startswith("trainyard ")
