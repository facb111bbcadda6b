"""Benchmark: what the runtime's per-step work adds to a training step.

    .venv/bin/python bench/runtime_overhead.py [--nproc 2] [--rounds 11] [--steps 10]

The same training loop, twice, in the same processes, alternating blocks of `--steps` steps for
`--rounds` rounds (after one warm-up round of each), so both see the same machine load:
- bare: a small Llama-style decoder (RMSNorm, causal attention, SwiGLU; 2 layers, width 256,
  sequence 64, 4 sequences per rank) under DDP on gloo, AdamW, a LambdaLR schedule; batches
  from a precomputed permutation; `loss.item()` every step;
- runtime: the same, plus what `trainyard.runtime.Run` does at each step end: the
  `ResumableSampler` hands out the batch and advances, a metrics line goes to `metrics.jsonl`
  (loss, lr, throughput), the watchdog is told, the ranks agree on preemption and on checkpoint
  failures (one all-reduce on the runtime's gloo group), the progress reporter is asked (off:
  no `TRAINYARD_API`). No checkpoint is taken in either loop (their cost is
  `bench/checkpoint_async.py`'s subject).
The figures: the median per-step time of each loop over its blocks; `ratio`, the median over
rounds of (runtime block / bare block of the same round) — paired, so that a change of machine
load between rounds cancels out (`ratio_of_medians` is reported too); and, since on a shared
machine even paired blocks of ~100 ms steps differ by more than the few hundred microseconds
measured, the time spent inside the runtime's calls themselves (`sampler.indices()` and
`run.step_done()`), per step, as a fraction of the bare step: the overhead without the noise.
That time is taken per step as the minimum over the ranks: the rank that reaches the agreement
all-reduce first waits there for the last one — a wait DDP's next gradient all-reduce would
impose anyway (rank 0's own figure, wait included, is reported too).
Ranks are launched here, one process each, with the job-environment variables, OMP_NUM_THREADS=1.
Also reported: the load average and the 1M-addition loop calibration of bench/README.md.
Prints one JSON object (rank 0). Target: ratio ≤ 1.03 and the hook fraction ≤ 3%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from _calibration import calibrate_ms
from _ranks import launch


def calibration_ms() -> float:
    return calibrate_ms(reps=1)


def rank_main(a: argparse.Namespace) -> None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import trainyard.runtime as yr

    torch.set_num_threads(1)
    ctx = yr.init(seed=0)
    vocab, dim, layers, heads, seq, per_rank = 512, 256, 2, 4, 64, 4

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n1, self.n2 = nn.RMSNorm(dim), nn.RMSNorm(dim)
            self.qkv, self.o = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
            self.w1, self.w3 = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(dim, 4 * dim, bias=False)
            self.w2 = nn.Linear(4 * dim, dim, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).view(b, t, 3, heads, dim // heads).unbind(2)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(att.transpose(1, 2).reshape(b, t, dim))
            h = self.n2(x)
            return x + self.w2(F.silu(self.w1(h)) * self.w3(h))

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, dim)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.RMSNorm(dim)
            self.head = nn.Linear(dim, vocab, bias=False)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.emb(tokens)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.norm(x))

    n_samples = 4096
    data = torch.randint(0, vocab, (n_samples, seq + 1), generator=torch.Generator().manual_seed(1))
    net = LM()
    model = DDP(net) if ctx.distributed else net
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
    gb = per_rank * ctx.world_size
    sampler = yr.ResumableSampler(n_samples, gb, seed=0, world_size=ctx.world_size, rank=ctx.rank)
    run = yr.Run(ctx, model=model, optimizer=opt, scheduler=sched, sampler=sampler,
                 checkpoint_dir=os.path.join(a.dir, "ckpt"), metrics_dir=os.path.join(a.dir, "metrics"),
                 checkpoint_every=None, final_checkpoint=False, watchdog_s=600.0)
    perm = torch.randperm(n_samples, generator=torch.Generator().manual_seed(2))
    cursor = [0]

    def train_step(ids: list[int] | torch.Tensor) -> torch.Tensor:
        batch = data[ids]
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        return loss

    def bare_block() -> float:
        t = time.perf_counter()
        for _ in range(a.steps):
            start = (cursor[0] * gb + ctx.rank * per_rank) % (n_samples - per_rank)
            cursor[0] += 1
            loss = train_step(perm[start:start + per_rank])
            loss.item()
        return (time.perf_counter() - t) / a.steps

    hook_s: list[float] = []

    def runtime_block() -> float:
        t = time.perf_counter()
        for _ in range(a.steps):
            h0 = time.perf_counter()
            ids = sampler.indices()
            h = time.perf_counter() - h0
            loss = train_step(ids)
            value = loss.item()
            h0 = time.perf_counter()
            run.step_done(loss=value, tokens=gb * seq)
            hook_s.append(h + time.perf_counter() - h0)
        return (time.perf_counter() - t) / a.steps

    run.resume()
    bare, rt = [], []
    for rnd in range(a.rounds + 1):
        b, r = (bare_block(), runtime_block()) if rnd % 2 == 0 else tuple(reversed((runtime_block(), bare_block())))
        if rnd > 0:  # round 0 warms up
            bare.append(b)
            rt.append(r)
    run.finish(close_process_group=False)
    # The faster rank waits in the agreement all-reduce for the slower one: time the DDP all-reduce
    # of the next step would wait anyway. The rank that arrives last does not wait, so the
    # per-step minimum over ranks is the runtime's own cost.
    all_hooks = [hook_s]
    if ctx.distributed:
        all_hooks = [None] * ctx.world_size
        torch.distributed.all_gather_object(all_hooks, hook_s, group=ctx.control_group)
    own = [min(per_rank) for per_rank in zip(*all_hooks)]
    if ctx.rank == 0:
        mb, mr = statistics.median(bare), statistics.median(rt)
        paired = statistics.median(r / b for r, b in zip(rt, bare))
        print(json.dumps({
            "bench": "runtime_overhead",
            "ranks": ctx.world_size,
            "params": sum(p.numel() for p in net.parameters()),
            "steps_per_block": a.steps,
            "rounds": a.rounds,
            "bare_step_ms": {"median": round(mb * 1000, 2), "min": round(min(bare) * 1000, 2),
                             "max": round(max(bare) * 1000, 2)},
            "runtime_step_ms": {"median": round(mr * 1000, 2), "min": round(min(rt) * 1000, 2),
                                "max": round(max(rt) * 1000, 2)},
            "added_ms_per_step": round((mr - mb) * 1000, 3),
            "ratio_of_medians": round(mr / mb, 4),
            "ratio": round(paired, 4),
            "hook_ms_per_step_rank0": {"median": round(statistics.median(hook_s) * 1000, 3),
                                       "mean": round(statistics.mean(hook_s) * 1000, 3)},
            "hook_ms_per_step_last_rank": {"median": round(statistics.median(own) * 1000, 3),
                                           "mean": round(statistics.mean(own) * 1000, 3),
                                           "p95": round(sorted(own)[int(0.95 * (len(own) - 1))] * 1000, 3)},
            "hook_fraction_of_bare_step": round(statistics.mean(own) / mb, 5),
            "target_ratio": 1.03,
            "met": paired <= 1.03 and statistics.mean(own) / mb <= 0.03,
            "loadavg": os.getloadavg(),
            "calibration_1m_add_ms": calibration_ms(),
        }), flush=True)
    ctx.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--rank-process", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_process:
        rank_main(a)
        return 0
    with tempfile.TemporaryDirectory(prefix="trainyard-overhead-") as tmp:
        return launch(__file__, a.nproc, ["--rounds", str(a.rounds), "--steps", str(a.steps), "--dir", a.dir or tmp])


if __name__ == "__main__":
    sys.exit(main())
