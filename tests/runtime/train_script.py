"""A small but complete training job for the runtime's tests (run it under torchrun or directly).

A two-layer MLP with dropout (so the generators' states matter), DDP when distributed, AdamW,
a warm-up LR schedule, and a synthetic dataset whose samples are known by id. Every rank appends
one line per completed step to `<out>/trace-rank<R>.jsonl`: the step, its loss as an exact hex
float, the sample ids it trained on and the attempt — what the tests compare bit for bit.

    python -m torch.distributed.run --nproc-per-node 2 tests/runtime/train_script.py --out DIR --steps 30
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import trainyard.runtime as yr

N_SAMPLES, DIM = 64, 16


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(DIM, 32)
        self.drop = nn.Dropout(0.2)
        self.fc2 = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.tanh(self.fc1(x))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--sync", action="store_true", help="blocking periodic checkpoints")
    ap.add_argument("--keep-last", type=int, default=3)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--marker-at", type=int, default=None, help="touch <out>/reached-<step>-rank<R> at this step")
    ap.add_argument("--hang-at", type=int, default=None)
    ap.add_argument("--hang-rank", type=int, default=None)
    ap.add_argument("--watchdog", type=float, default=None)
    ap.add_argument("--fill-disk-at", type=int, default=None, help="rank 0 fills the checkpoint disk after this step")
    ap.add_argument("--leave-kb", type=int, default=4, help="… leaving this much free")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    torch.set_num_threads(1)
    ctx = yr.init(seed=1234, deterministic=True)
    data_gen = torch.Generator().manual_seed(99)  # the dataset: fixed, independent of the seeds above
    X = torch.randn(N_SAMPLES, DIM, generator=data_gen)
    Y = (X[:, :1] * 0.5 + X[:, 1:2].sin()).clone()

    net = Net()
    model = DDP(net) if ctx.distributed else net
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    sampler = yr.ResumableSampler(N_SAMPLES, a.global_batch, seed=7, world_size=ctx.world_size, rank=ctx.rank)
    run = yr.Run(ctx, model=model, optimizer=opt, scheduler=sched, sampler=sampler,
                 checkpoint_every=a.checkpoint_every, keep_last=a.keep_last, async_checkpoint=not a.sync,
                 watchdog_s=a.watchdog, first_step_timeout_s=a.watchdog and 60.0, progress_every_s=0.0)
    trace = open(out / f"trace-rank{ctx.rank}.jsonl", "a")
    attempt = int(os.environ.get("TRAINYARD_ATTEMPT", "0"))

    for step in run.steps(a.steps):
        if a.hang_at == step and a.hang_rank in (None, ctx.rank):
            time.sleep(3600)  # a hung rank: the watchdog must end it
        ids = sampler.indices()
        x, y = X[ids], Y[ids]
        model.train()
        loss = F.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        trace.write(json.dumps({"step": step, "loss": loss.item().hex(), "ids": ids, "attempt": attempt,
                                "world": ctx.world_size}) + "\n")
        trace.flush()
        run.log(loss=loss)
        if a.step_sleep:
            time.sleep(a.step_sleep)
        if a.marker_at == step:
            (out / f"reached-{step}-rank{ctx.rank}").touch()
        if a.fill_disk_at == step and ctx.rank == 0:
            ckpt = run.checkpoints.directory
            run.checkpoints.wait()
            (ckpt.parent / "ballast").write_bytes(b"\0" * max(0, shutil.disk_usage(ckpt).free - a.leave_kb * 1024))
    print(f"rank {ctx.rank}: done at step {run.step}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
