"""Run every benchmark in this folder and print its figures (see bench/README.md).

    .venv/bin/python bench/run_all.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent

BENCHES = [
    ("scheduling cycle, trainyard (1,250 x 8 GPUs, 5,000 pending, 8,000 running)",
     [str(BIN / "yard"), "bench", "sched", "--nodes", "1250", "--gpus-per-node", "8", "--pending", "5000",
      "--running", "8000", "--json"]),
    ("full Philly replay, trainyard, 352 x 8 GPUs", [sys.executable, str(HERE / "replay_philly.py")]),
    ("issue 2's acceptance rule on ten Philly windows, every policy (~4 min on 2 cores)",
     [sys.executable, str(HERE / "philly_windows.py"), "--json"]),
    ("1,000 job submissions over HTTP to yard up on SQLite (held/unheld, 1 and 4 clients)",
     [sys.executable, str(HERE / "submit_http.py"), "--json"]),
    ("yard queue with 10,000 jobs stored (yard up on SQLite)", [sys.executable, str(HERE / "queue_10k.py"), "--json"]),
    ("the loop's dependency step with 10,000 jobs pending", [sys.executable, str(HERE / "dependencies.py"), "--json"]),
    ("the loop's idle step with 1,000 jobs running under an idle policy (~2 min)",
     [sys.executable, str(HERE / "idle_step.py"), "--json"]),
    ("200 concurrent clients and 20 log followers against yard up for 60 s (issue 16's targets)",
     [sys.executable, str(HERE / "api_load.py"), "--json"]),
    ("fault recovery of the yard chaos scenarios, against the 30 s target (~3 min)",
     [sys.executable, str(HERE / "chaos_recovery.py"), "--json"]),
    ("the wheel installed without extras in a fresh venv: no torch, venv size, yard queue start-up (~1.5 min)",
     [sys.executable, str(HERE / "install_base.py"), "--json"]),
    ("what a job's files cost the plane: a 1 GB log, an 800 MB metrics file, a FIFO (issue 34, ~1 min)",
     [sys.executable, str(HERE / "plane_reads.py")]),
    ("what an image costs a job: first line cold/warm, start overhead, steps/s in and out (issue 37, root, ~8 min)",
     [sys.executable, str(HERE / "images_start.py"), "--json", str(HERE / "results" / "images_start.json")]),
    ("the node agent: one node of 8 emulated GPUs sampled at 1 Hz (issue 39)",
     [sys.executable, str(HERE / "node_agent.py")]),
    ("a yard process's start-up: CPU, wall and modules of a few commands (the suite starts thousands)",
     [sys.executable, str(HERE / "cli_startup.py")]),
]


def main() -> int:
    status = 0
    for title, cmd in BENCHES:
        print(f"## {title}\n$ {' '.join(Path(c).name if i == 0 else c for i, c in enumerate(cmd))}", flush=True)
        done = subprocess.run(cmd, text=True, capture_output=True)
        print(done.stdout.strip() or done.stderr.strip(), flush=True)
        status |= done.returncode
    return status


if __name__ == "__main__":
    sys.exit(main())
