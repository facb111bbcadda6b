"""Benchmark: how long an asynchronous checkpoint blocks the training loop, against a synchronous one.

    .venv/bin/python bench/checkpoint_async.py [--params-m 16] [--reps 5] [--nproc 1] [--dir DIR]

The state: a stack of Linear layers with `--params-m` million float32 parameters and an AdamW
optimizer that has taken one step (so its two moments exist): 3 x params x 4 bytes in all
(192 MB at the default 16 M). `trainyard.runtime.CheckpointManager` saves it under `--dir`
(default: a temporary directory on the disk that holds /tmp; not a tmpfs), fsync'ed, `--reps`
times each way, alternating:
- sync: `save(step, blocking=True)`, from the call to its return (committed);
- async: `save(step, blocking=False)`, from the call to its return — what the training loop
  waits for (per-rank state file, staging copy of the tensors to CPU memory); then the time until
  the background write has committed (`wait()`), reported but not part of the blocking time.
The first round is a warm-up and not counted; its async blocking time (which includes allocating
the reusable staging buffers) is reported as `first_async_blocking_s`.
With `--nproc N` the same runs on N gloo ranks (launched here, one process each), each rank
saving its DCP shard; rank 0's figures are reported.

Also reported: the load average and the 1M-addition loop calibration of bench/README.md.
Prints one JSON object. Target: async blocking ≤ 20% of the sync save (median over reps).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _calibration import calibrate_ms


def calibration_ms() -> float:
    return calibrate_ms(reps=1)


def rank_main(a: argparse.Namespace) -> None:
    import torch

    import trainyard.runtime as yr

    torch.set_num_threads(1)
    ctx = yr.init(seed=0)
    width = 1024
    layers = max(1, round(a.params_m * 1e6 / (width * width + width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).sum().backward()
    opt.step()
    n_params = sum(p.numel() for p in model.parameters())
    mgr = yr.CheckpointManager(Path(a.dir) / "ckpt", model=model, optimizer=opt, keep_last=2,
                               group=ctx.checkpoint_group, control_group=ctx.control_group)
    sync_s, async_block_s, async_total_s = [], [], []
    step = 0
    for _ in range(a.reps + 1):  # the first round warms up (allocations, page cache, imports)
        step += 1
        t = time.perf_counter()
        mgr.save(step, blocking=True)
        sync_s.append(time.perf_counter() - t)
        step += 1
        t = time.perf_counter()
        mgr.save(step, blocking=False)
        async_block_s.append(time.perf_counter() - t)
        mgr.wait()
        async_total_s.append(time.perf_counter() - t)
    first_async_block_s = async_block_s[0]  # includes allocating the staging buffers
    sync_s, async_block_s, async_total_s = sync_s[1:], async_block_s[1:], async_total_s[1:]
    if ctx.rank == 0:
        med_sync, med_block = statistics.median(sync_s), statistics.median(async_block_s)
        print(json.dumps({
            "bench": "checkpoint_async",
            "ranks": ctx.world_size,
            "params": n_params,
            "state_mb": round(3 * n_params * 4 / 1e6, 1),
            "reps": a.reps,
            "sync_save_s": {"median": round(med_sync, 4), "min": round(min(sync_s), 4), "max": round(max(sync_s), 4)},
            "async_blocking_s": {"median": round(med_block, 4), "min": round(min(async_block_s), 4),
                                 "max": round(max(async_block_s), 4)},
            "first_async_blocking_s": round(first_async_block_s, 4),
            "async_until_committed_s": {"median": round(statistics.median(async_total_s), 4)},
            "blocking_ratio": round(med_block / med_sync, 4),
            "target_ratio": 0.20,
            "met": med_block / med_sync <= 0.20,
            "dir": str(a.dir),
            "loadavg": os.getloadavg(),
            "calibration_1m_add_ms": calibration_ms(),
        }), flush=True)
    ctx.close()


def launch(a: argparse.Namespace) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(a.nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(a.nproc),
                   LOCAL_WORLD_SIZE=str(a.nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-process", "--params-m", str(a.params_m),
                                       "--reps", str(a.reps), "--dir", a.dir], env=env))
    return max(p.wait() for p in procs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--params-m", type=float, default=16.0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--rank-process", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_process:
        rank_main(a)
        return 0
    own = a.dir is None
    # /var/tmp: on disk on most systems, where /tmp may be a tmpfs (a save would only copy memory)
    a.dir = a.dir or tempfile.mkdtemp(prefix="trainyard-ckpt-bench-",
                                      dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    try:
        if a.nproc == 1:
            rank_main(a)
            return 0
        return launch(a)
    finally:
        if own:
            shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
