"""The memory planner against measured peaks of real training steps of the recipes' models.

    .venv/bin/python bench/memory_planner.py            # every configuration, table + bench/results/
    .venv/bin/python bench/memory_planner.py --quick    # the two smallest (what tests/plan runs)

Each configuration runs in a fresh process (one, or two ranks over gloo): the recipes' model
(`recipes.models.build_model`), optimizer (`recipes.train.build_optimizer`), strategy
(`recipes.strategies.wrap`) and loss (`recipes.train.next_token_loss`), one warm-up step (Adam's
states exist from then on), then one step measured by PyTorch's own accounting of live tensors
(`torch.distributed._tools.mem_tracker.MemTracker`; `FSDPMemTracker` under FSDP2): the peak of
the bytes of every tensor alive, by category. On a GPU that is what
`torch.cuda.max_memory_allocated` reports, less the caching allocator's rounding; on a CPU it is
the only exact figure (the process's RSS also counts the allocator's free lists and the
interpreter). The planner is asked about the same model (its HF config), precision (fp32, as the
recipes train on CPUs), sequence, micro-batch, strategy and data-parallel degree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "memory_planner.json"

SMALL = {"hidden_size": 256, "intermediate_size": 688, "num_layers": 4, "num_heads": 8, "num_kv_heads": 4}
CONFIGS = [
    # name, model spec, seq, micro-batch, processes, strategy[, activation checkpointing]
    ("llama, vocab 264, 1 process", {"arch": "llama", **SMALL, "vocab_size": 264}, 256, 8, 1, "ddp"),
    ("llama, vocab 32000, 1 process", {"arch": "llama", **SMALL, "vocab_size": 32000}, 256, 4, 1, "ddp"),
    ("gemma, head_dim 64, 1 process", {"arch": "gemma", **SMALL, "num_kv_heads": 1, "head_dim": 64,
                                       "vocab_size": 8192}, 512, 4, 1, "ddp"),
    ("llama, 8 layers, seq 1024, 1 process", {"arch": "llama", **SMALL, "num_layers": 8, "vocab_size": 264}, 1024, 2,
     1, "ddp"),
    ("llama, vocab 32000, DDP on 2", {"arch": "llama", **SMALL, "vocab_size": 32000}, 256, 4, 2, "ddp"),
    ("llama, vocab 32000, FSDP2 on 2", {"arch": "llama", **SMALL, "vocab_size": 32000}, 256, 4, 2, "fsdp2"),
    ("llama, seq 1024, selective recompute", {"arch": "llama", **SMALL, "vocab_size": 264}, 1024, 2, 1, "ddp",
     "selective"),
    ("llama, seq 1024, full recompute", {"arch": "llama", **SMALL, "vocab_size": 264}, 1024, 2, 1, "ddp", "full"),
    ("llama, seq 1024, full recompute, FSDP2 on 2", {"arch": "llama", **SMALL, "vocab_size": 264}, 1024, 2, 2,
     "fsdp2", "full"),
]
QUICK = CONFIGS[:2]


# -- one configuration, in its own process(es) ---------------------------------------------------------------


def _step_fn(model, optimizer, tokens):  # noqa: ANN001, ANN202
    from trainyard.recipes.train import next_token_loss

    def step() -> None:
        loss = next_token_loss(model, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _measure_rank(rank: int, world: int, cfg: dict, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from trainyard.recipes import checkpointing
    from trainyard.recipes.models import build_model
    from trainyard.recipes.spec import ModelSpec, RecipeSpec
    from trainyard.recipes.strategies import unwrap, wrap
    from trainyard.recipes.train import build_optimizer

    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    spec = RecipeSpec(kind="pretrain", model=ModelSpec(**cfg["model"], max_seq_len=max(512, cfg["seq"])),
                      strategy=cfg["strategy"])
    base = build_model(spec.model)
    checkpointing.apply(base, cfg["recompute"])  # before sharding, as the recipes do
    model = wrap(base, spec.strategy, torch.device("cpu"))
    optimizer = build_optimizer(model, spec)
    gen = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, spec.model.vocab_size, (cfg["micro_batch"], cfg["seq"] + 1), generator=gen)
    step = _step_fn(model, optimizer, tokens)
    step()  # warm-up: Adam's states are created here
    if cfg["strategy"] == "fsdp2" and world > 1:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        tracker = FSDPMemTracker(model, optimizer)
    else:
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        tracker.track_external(model, optimizer)
    with tracker:
        step()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    cats = {getattr(k, "value", str(k)): int(v) for k, v in peak.items() if k != "Total"}
    total = int(peak["Total"])
    if hasattr(model, "_get_ddp_logging_data"):
        # DDP's reducer allocates its gradient buckets in C++ at construction, where the tracker does
        # not see them; they live as long as the model: added from DDP's own record of their sizes.
        sizes = str(model._get_ddp_logging_data().get("bucket_sizes", "") or "")
        cats["DDP buckets"] = sum(int(x) for x in sizes.replace(" ", "").split(",") if x)
        total += cats["DDP buckets"]
    if rank == 0:
        Path(out).write_text(json.dumps({"peak": total, "by_category": cats,
                                         "hf_config": unwrap(model).config.to_dict()}))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_one(cfg: dict, out: str) -> None:
    world = cfg["nproc"]
    if world == 1:
        _measure_rank(0, 1, cfg, 0, out)
        return
    import torch.multiprocessing as mp

    mp.spawn(_measure_rank, args=(world, cfg, _free_port(), out), nprocs=world, join=True)


# -- the comparison ----------------------------------------------------------------------------------------------


def planned(hf_config: dict, cfg: dict) -> tuple[float, str]:
    """The planner's peak (bytes) and moment for the configuration's model and setup."""
    from trainyard.plan.memory import TrainSetup, load_hf_config, memory_per_gpu

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "config.json"
        p.write_text(json.dumps(hf_config))
        arch = load_hf_config(p)
    setup = TrainSetup(strategy="fsdp" if cfg["strategy"] == "fsdp2" else "ddp", precision="fp32", seq=cfg["seq"],
                       micro_batch=cfg["micro_batch"], recompute=cfg["recompute"])
    bd = memory_per_gpu(arch, setup, dp=cfg["nproc"])
    return bd.total, bd.moment


def measure(configs: list[tuple]) -> list[dict]:
    rows = []
    for name, model, seq, mb, nproc, strategy, *rest in configs:
        cfg = {"name": name, "model": model, "seq": seq, "micro_batch": mb, "nproc": nproc, "strategy": strategy,
               "recompute": rest[0] if rest else "none"}
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "peak.json")
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
            subprocess.run([sys.executable, __file__, "--one", json.dumps(cfg), "--out", out], check=True, env=env,
                           timeout=600)
            got = json.loads(Path(out).read_text())
        plan, moment = planned(got["hf_config"], cfg)
        rows.append({**cfg, "measured": got["peak"], "by_category": got["by_category"], "planned": round(plan),
                     "moment": moment, "error": plan / got["peak"] - 1})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| configuration | seq x micro-batch | measured peak MiB | planned MiB | error | planned peak at |",
             "|---|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['seq']} x {r['micro_batch']} | {r['measured'] / 2**20:,.1f} | "
                     f"{r['planned'] / 2**20:,.1f} | {r['error']:+.1%} | {r['moment']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the two smallest configurations only")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        _run_one(json.loads(args.one), args.out)
        return
    rows = measure(QUICK if args.quick else CONFIGS)
    print(table(rows))
    if not args.quick:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(rows, indent=1))
        print(f"written: {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
