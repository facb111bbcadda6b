"""`yard bench scaling` on the local backend's 2 emulated nodes (issue 39; bench/README.md,
"Issue 39: scaling on emulated nodes").

Starts a real `yard up` (tests/yard_cluster.py: two emulated 4-GPU nodes, teams vision and nlp) in
a temporary data dir and runs `yard bench scaling llama-pretrain -N 1,2 --gpus-per-node 1` on it,
the recipes' tiny Llama (125k parameters, 64-token sequences) with the global batch and steps given,
once per `--batch`; prints the machine's conditions (load before and after) and each table.

    .venv/bin/python bench/scaling_emulated.py --batch 64,8 --steps 600     # ~4 min
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from _yard import conditions  # noqa: E402

from tests.recipes.helpers import TINY_MODEL  # noqa: E402
from tests.yard_cluster import YardCluster  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="64", help="global batch sizes, one scaling run each: 64,8")
    ap.add_argument("--steps", type=int, default=600)
    a = ap.parse_args()
    c = YardCluster(Path(tempfile.mkdtemp(prefix="bench-scaling-")), "local")
    rc = 0
    try:
        for batch in a.batch.split(","):
            sets = [*TINY_MODEL, "data.seq_len=64", "data.max_bytes=400000", "optim.warmup_steps=2",
                    "checkpoint_every=100", f"batch.global_batch_size={int(batch)}", f"steps={a.steps}"]
            before, t0 = conditions(), time.monotonic()
            r = c.yard("bench", "scaling", "llama-pretrain", "-N", "1,2", "--gpus-per-node", "1", "-A", "vision",
                       "--env", "OMP_NUM_THREADS=1", *(x for s in sets for x in ("--set", s)), timeout=1800,
                       check=False)
            print(f"global batch {batch}, {a.steps} steps: {time.monotonic() - t0:.0f} s, rc {r.returncode}; "
                  f"before {before}, load after {os.getloadavg()[0]:.2f}")
            print(r.stdout if r.returncode == 0 else r.stdout + r.stderr, flush=True)
            rc = rc or r.returncode
    finally:
        c.stop()
    return rc


if __name__ == "__main__":
    sys.exit(main())
