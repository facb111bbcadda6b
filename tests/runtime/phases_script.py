"""A training job for the phase-timing tests: one rank per process, run with the job environment.

An MLP (under DDP when distributed) fed by a loader iterated through `run.data`; options make the
loader slow (`--data-sleep`), a rank slow in its own compute between forward and backward
(`--slow-rank`, `--slow-s`: DDP's all-reduce then waits for it on the other ranks) or, with
`--slow-before-forward`, before its forward (with `--buffer`, a module buffer DDP broadcasts from
rank 0 before each forward, rank 0 waits for it there), the checkpoints
synchronous, the phase file written often (`--every`). At the end each rank writes its final
parameters (`params-rank<R>.pt`) and the seconds its checkpoints took (`saves-rank<R>.json`, from
the runtime's own commit callback: blocking saves are timed there as the loop saw them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import trainyard.runtime as yr


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--data-sleep", type=float, default=0.0)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--slow-rank", type=int, default=None)
    ap.add_argument("--slow-s", type=float, default=0.0)
    ap.add_argument("--slow-before-forward", action="store_true")
    ap.add_argument("--buffer", action="store_true", help="a module buffer (DDP broadcasts it every forward)")
    ap.add_argument("--checkpoint-every", type=int, default=None)
    ap.add_argument("--every", type=float, default=2.0, help="phases_every_s")
    a = ap.parse_args()
    out = Path(a.out)

    torch.set_num_threads(1)
    ctx = yr.init(seed=3)
    net = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
    if a.buffer:
        net.register_buffer("scale", torch.ones(64))
    model = DDP(net) if ctx.distributed else net
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    run = yr.Run(ctx, model=model, optimizer=opt, checkpoint_every=a.checkpoint_every, async_checkpoint=False,
                 final_checkpoint=a.checkpoint_every is not None, phases_every_s=a.every)
    saves: list[tuple[int, float]] = []
    run.checkpoints.on_commit.append(lambda step, path, seconds: saves.append((step, seconds)))
    gen = torch.Generator().manual_seed(10 + ctx.rank)

    def loader():
        while True:
            if a.data_sleep:
                time.sleep(a.data_sleep)
            x = torch.randn(16, 32, generator=gen)
            yield x, x[:, :1].sin()

    for step, (x, y) in zip(run.steps(a.steps), run.data(loader())):
        if ctx.rank == a.slow_rank and a.slow_before_forward:
            time.sleep(a.slow_s)
        loss = F.mse_loss(model(x), y)
        if ctx.rank == a.slow_rank and not a.slow_before_forward:
            time.sleep(a.slow_s)  # this rank's own work is slower: the others wait in the all-reduce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        run.log(loss=loss)
        if a.step_sleep:
            time.sleep(a.step_sleep)
    torch.save({k: v.detach().clone() for k, v in net.state_dict().items()}, out / f"params-rank{ctx.rank}.pt")
    (out / f"saves-rank{ctx.rank}.json").write_text(json.dumps(saves))
    print(f"rank {ctx.rank}: done at step {run.step}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
