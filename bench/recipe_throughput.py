"""Tokens/s of the recipes' CPU path: today's defaults against the path before issue 19 part 5.

    .venv/bin/python bench/recipe_throughput.py [--rounds 3] [--steps 40] [--nproc 2]

`yard run llama-pretrain` (hidden 256, 4 layers, sequence 128, 16 sequences a step, DDP on
`--nproc` processes, OMP_NUM_THREADS=1 each), run the way a user runs it, alternately with
- `now`: the defaults (AdamW foreach, DDP's find_unused_parameters off on 2 ranks, log_every 1 on
  CPUs, the logits dropped before backward), and
- `before`: `--set optim.implementation=for-loop --set ddp_find_unused=true`, what the recipes ran
  until this change (the logits' drop cannot be turned off; it saves memory, not time, on CPUs),
for `--rounds` rounds, so both see the same machine load. Per run: the median `tokens_per_s` of
its metrics lines after the first 5 steps. Reported: each side's median over rounds and the
median of the per-round ratios now / before (paired: a change of machine load between rounds
cancels out). The issue's line: the CPU path must not get slower (ratio >= 1, within noise).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
YARD = str(Path(sys.executable).parent / "yard")
MODEL = ["model.hidden_size=256", "model.intermediate_size=688", "model.num_layers=4", "model.num_heads=8",
         "model.num_kv_heads=4", "data.seq_len=128", "data.max_bytes=2000000", "batch.global_batch_size=16",
         "checkpoint_every=null", "print_every=1000"]
SIDES = {"now": [], "before": ["optim.implementation=for-loop", "ddp_find_unused=true"]}


def tokens_per_s(out: Path, skip: int = 5) -> float:
    rows = [json.loads(x) for x in (out / "metrics" / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tokens_per_s"] for r in rows if "event" not in r and r.get("step", 0) > skip and "tokens_per_s" in r]
    return statistics.median(rates)


def one(side: str, steps: int, nproc: int, tmp: Path, n: int) -> float:
    out = tmp / f"{side}-{n}"
    cmd = [YARD, "run", "llama-pretrain", "--nproc", str(nproc), "--out", str(out)]
    for s in [*MODEL, f"steps={steps}", *SIDES[side]]:
        cmd += ["--set", s]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_", "YARD_"))}
    env["OMP_NUM_THREADS"] = "1"
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
    return tokens_per_s(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--nproc", type=int, default=2)
    args = ap.parse_args()
    got: dict[str, list[float]] = {s: [] for s in SIDES}
    with tempfile.TemporaryDirectory() as d:
        for n in range(args.rounds):
            order = list(SIDES) if n % 2 == 0 else list(reversed(SIDES))
            for side in order:
                got[side].append(one(side, args.steps, args.nproc, Path(d), n))
    ratios = [a / b for a, b in zip(got["now"], got["before"])]
    print(json.dumps({"tokens_per_s": {s: round(statistics.median(v), 1) for s, v in got.items()},
                      "per_round": {s: [round(x, 1) for x in v] for s, v in got.items()},
                      "ratio_now_over_before": round(statistics.median(ratios), 3),
                      "load": os.getloadavg()[0], "rounds": args.rounds, "steps": args.steps, "nproc": args.nproc},
                     indent=1))


if __name__ == "__main__":
    main()
