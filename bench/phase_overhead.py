"""Benchmark: what phase timing (issue 39) adds to a training step.

    .venv/bin/python bench/phase_overhead.py [--nproc 2] [--rounds 151] [--steps 1]

Two copies of the same recipe-like training, in the same processes, alternating blocks of `--steps`
steps for `--rounds` rounds (after one warm-up round; the order within a round alternates too), so
both see the same machine load (by default they alternate step by step: on a shared machine, load
changes within seconds, and two neighbouring steps see the most similar load):
- the model is the recipes' own (`trainyard.recipes.models.build_model`: transformers' Llama, the
  recipe defaults of 4 layers, width 256, 3.4M parameters), sequences of 64 tokens, 4 per rank,
  under DDP on gloo, AdamW; batches come from a generator iterated through `run.data(...)`,
  `run.step_done(loss=…)` ends each step (metrics line, agreement…);
- `on`: `Run(phase_timing=True)`: the timed `next()`, the DDP communication hook in place of
  DDP's built-in all-reduce, the phase accounting at each step end, the file handed to its writer
  thread every 1 s; `off`: `Run(phase_timing=False)`: `run.data` returns the generator itself, DDP
  keeps its built-in hook, no file.
The figure: `ratio`, the median over rounds of (on block / off block of the same round) — paired,
so that a change of machine load between rounds cancels out — with its distribution-free 95%
interval (`ratio_ci95`, order statistics); `ratio_of_medians` too. Since on a
shared machine paired blocks differ by more than the microseconds measured, the parts' own costs
are also timed alone, in a loop of 20,000, on rank 0 (`parts_us`): a timed `next()` beyond a
plain one, `step_ended` (with a recent-steps window and a comm interval, as under DDP), the
hook's Python work per bucket beyond DDP's (launch and completion callback, on a 1-rank gloo
group), the two forward pre-hooks that time DDP's buffer broadcast (per forward, on a model with a
buffer); their sum per step as a fraction of the off step is `parts_fraction_of_step`.
`--control` runs both copies without phase timing: the two copies' own difference (memory
placement, order), to judge the `ratio` against.
Ranks are launched here, one process each, with the job-environment variables, OMP_NUM_THREADS=1.
Prints one JSON object (rank 0). Goal: ratio ≤ 1.01 and parts_fraction_of_step ≤ 1%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _calibration import calibrate_ms
from _ranks import launch

SEQ, PER_RANK = 64, 4


def parts_us(tmp: str, n: int = 20_000) -> dict[str, float]:
    """The per-step parts of phase timing, each alone: microseconds per call."""
    from trainyard.runtime.phases import PhaseClock

    clock = PhaseClock(Path(tmp) / "parts" / "p.json", attempt=0, rank=0, every_s=2.0)
    items = list(range(n))
    t = time.perf_counter()
    for _ in iter(items):
        pass
    plain = time.perf_counter() - t
    t = time.perf_counter()
    for _ in clock.data(items):
        pass
    timed_next = (time.perf_counter() - t - plain) / n
    clock.start()
    t = time.perf_counter()
    for step in range(1, n + 1):
        now = time.perf_counter()
        clock.comm_interval(now - 1e-4, now - 5e-5)
        clock.step_ended(step, 0.1)
    step_end = (time.perf_counter() - t) / n
    clock.finish()

    return {"timed_next": round(timed_next * 1e6, 3), "step_ended": round(step_end * 1e6, 3)}


def hook_us(n: int = 1000) -> tuple[float, float]:
    """The timed hook's cost per bucket beyond DDP's built-in all-reduce, and the pre-forward
    hooks' per forward: two one-bucket models with a buffer, one hooked, their forwards and
    backwards alternated and timed one by one, median against median (collective: every rank
    runs it)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainyard.runtime.comm_timing import hook_ddp

    def net() -> torch.nn.Module:
        m = torch.nn.Linear(8, 8)
        m.register_buffer("scale", torch.ones(8))  # DDP broadcasts it before every forward
        return DDP(m)

    plain, hooked = net(), net()
    hook_ddp(hooked, lambda a, b: None)
    x = torch.randn(2, 8)
    back: dict[bool, list[float]] = {False: [], True: []}
    fwd: dict[bool, list[float]] = {False: [], True: []}
    for i in range(n + 50):
        for on, m in ((False, plain), (True, hooked)) if i % 2 else ((True, hooked), (False, plain)):
            t = time.perf_counter()
            loss = m(x).sum()
            t1 = time.perf_counter()
            loss.backward()
            if i >= 50:
                fwd[on].append(t1 - t)
                back[on].append(time.perf_counter() - t1)

    def extra(times: dict[bool, list[float]]) -> float:
        return round(max(0.0, statistics.median(times[True]) - statistics.median(times[False])) * 1e6, 3)

    return extra(back), extra(fwd)


def rank_main(a: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import trainyard.runtime as yr
    from trainyard.recipes.models import build_model
    from trainyard.recipes.spec import ModelSpec

    torch.set_num_threads(1)
    ctx = yr.init(seed=0)
    spec = ModelSpec()
    data = torch.randint(0, spec.vocab_size, (4096, SEQ + 1), generator=torch.Generator().manual_seed(1))

    def make(on: bool) -> tuple[yr.Run, torch.nn.Module, torch.optim.Optimizer, object]:
        torch.manual_seed(0)
        net = build_model(spec)
        model = DDP(net) if ctx.distributed else net
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        name = "on" if on else "off"
        run = yr.Run(ctx, model=model, optimizer=opt, checkpoint_dir=os.path.join(a.dir, name, "ckpt"),
                     metrics_dir=os.path.join(a.dir, name, "metrics"), checkpoint_every=None,
                     final_checkpoint=False, phase_timing=on and not a.control)

        def batches():
            i = ctx.rank * PER_RANK
            while True:
                i = (i + ctx.world_size * PER_RANK) % (len(data) - PER_RANK)
                yield data[i:i + PER_RANK]

        return run, model, opt, iter(run.data(batches()))

    runs = {True: make(True), False: make(False)}

    def block(on: bool) -> float:
        run, model, opt, it = runs[on]
        t = time.perf_counter()
        for _ in range(a.steps):
            batch = next(it)
            logits = model(input_ids=batch[:, :-1]).logits
            loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            run.step_done(loss=loss.item(), tokens=SEQ * PER_RANK * ctx.world_size)
        return (time.perf_counter() - t) / a.steps

    for run, *_ in runs.values():
        run.resume()
    on_s, off_s = [], []
    for rnd in range(a.rounds + 1):
        order = (True, False) if rnd % 2 == 0 else (False, True)
        got = {o: block(o) for o in order}
        if rnd > 0:  # round 0 warms up
            on_s.append(got[True])
            off_s.append(got[False])
    writes = runs[True][0].phases.file.writes if runs[True][0].phases else 0
    n_buckets = (len(runs[True][1]._get_ddp_logging_data().get("bucket_sizes", "").split(","))
                 if ctx.distributed else 0)
    for run, *_ in runs.values():
        run.finish(close_process_group=False)
    hook, pre_forward = hook_us() if ctx.distributed else (0.0, 0.0)
    if ctx.rank == 0:
        parts = {**parts_us(a.dir), "hook_per_bucket": hook, "pre_forward": pre_forward}
        m_on, m_off = statistics.median(on_s), statistics.median(off_s)
        ratios = sorted(x / y for x, y in zip(on_s, off_s))
        paired = statistics.median(ratios)
        # distribution-free 95% interval of the median: the order statistics n/2 -+ 0.98 sqrt(n)
        k = int(0.98 * len(ratios) ** 0.5)
        mid = len(ratios) // 2
        ci95 = [round(ratios[max(0, mid - k)], 4), round(ratios[min(len(ratios) - 1, mid + k)], 4)]
        per_step_us = (parts["timed_next"] + parts["step_ended"] + max(1, n_buckets) * parts["hook_per_bucket"]
                       + parts["pre_forward"])
        print(json.dumps({
            "bench": "phase_overhead" + (" (control: both off)" if a.control else ""),
            "ranks": ctx.world_size,
            "params": sum(p.numel() for p in runs[False][1].parameters()),
            "ddp_buckets": n_buckets,
            "steps_per_block": a.steps,
            "rounds": a.rounds,
            "off_step_ms": {"median": round(m_off * 1000, 2), "min": round(min(off_s) * 1000, 2),
                            "max": round(max(off_s) * 1000, 2)},
            "on_step_ms": {"median": round(m_on * 1000, 2), "min": round(min(on_s) * 1000, 2),
                           "max": round(max(on_s) * 1000, 2)},
            "ratio": round(paired, 4),
            "ratio_of_medians": round(m_on / m_off, 4),
            "ratio_ci95": ci95,
            "paired_ratio_quartiles": [round(q, 3) for q in statistics.quantiles(ratios, n=4)],
            "parts_us": parts,
            "parts_us_per_step": round(per_step_us, 2),
            "parts_fraction_of_step": round(per_step_us / 1e6 / m_off, 6),
            "file_writes_on_rank0": writes,
            "goal": {"ratio": 1.01, "parts_fraction_of_step": 0.01},
            "loadavg": os.getloadavg(),
            "calibration_1m_add_ms": calibrate_ms(reps=1),
        }), flush=True)
    ctx.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=151)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--control", action="store_true",
                    help="both copies without phase timing: how far apart the two copies are by themselves")
    ap.add_argument("--rank-process", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_process:
        rank_main(a)
        return 0
    with tempfile.TemporaryDirectory(prefix="trainyard-phases-") as tmp:
        return launch(__file__, a.nproc, ["--rounds", str(a.rounds), "--steps", str(a.steps), "--dir", a.dir or tmp,
                                          *(["--control"] if a.control else [])])


if __name__ == "__main__":
    sys.exit(main())
