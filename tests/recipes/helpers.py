"""Running `yard run` as a real process and reading what the run left in its out dir."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

YARD = str(Path(sys.executable).parent / "yard")
# The data dir of the `yard` processes the tests start: exports record themselves in its models/
# (recipes/registry.py), which must not be the user's own ~/.trainyard. One per test process.
DATA_DIR = Path(tempfile.mkdtemp(prefix="yard-test-data-"))
atexit.register(shutil.rmtree, DATA_DIR, True)

# A Llama of 125k parameters on 400 kB of stdlib source: ~30 ms a step on one core.
TINY_MODEL = ["model.hidden_size=64", "model.intermediate_size=172", "model.num_layers=2", "model.num_heads=4",
              "model.num_kv_heads=2"]
TINY_PRETRAIN = [*TINY_MODEL, "data.seq_len=64", "data.max_bytes=400000", "batch.global_batch_size=8",
                 "optim.warmup_steps=2"]


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_", "YARD_"))}
    e["OMP_NUM_THREADS"] = "1"  # one thread per rank: two test workers share two cores
    e["YARD_DATA_DIR"] = str(DATA_DIR)
    return e


def command(recipe: str, out: Path, nproc: int, sets: list[str]) -> list[str]:
    cmd = [YARD, "run", recipe, "--nproc", str(nproc), "--out", str(out)]
    for s in sets:
        cmd += ["--set", s]
    return cmd


class YardRun:
    """One `yard run` process; its output goes to `<out>.yard-<n>.log`."""

    def __init__(self, recipe: str, out: Path, nproc: int, sets: list[str]) -> None:
        self.out = out
        out.parent.mkdir(parents=True, exist_ok=True)
        n = len(list(out.parent.glob(f"{out.name}.yard-*.log")))
        self.log_path = out.parent / f"{out.name}.yard-{n}.log"
        self.proc = subprocess.Popen(command(recipe, out, nproc, sets), stdout=open(self.log_path, "w"),
                                     stderr=subprocess.STDOUT, env=env(), start_new_session=True)

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def wait(self, timeout: float = 240) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            for pid in rank_pids(self.out):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            raise AssertionError(f"yard run did not finish in {timeout} s\n{self.log[-4000:]}") from None

    def wait_for_step(self, step: int, timeout: float = 120) -> int:
        """Block until metrics.jsonl has a step >= `step`; return the newest step seen."""
        deadline = time.monotonic() + timeout
        while True:
            seen = max(losses(self.out), default=0) if (self.out / "metrics" / "metrics.jsonl").exists() else 0
            if seen >= step:
                return seen
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"step {step} not reached (at {seen})\n{self.log[-4000:]}")
            time.sleep(0.01)


def yard_run(recipe: str, out: Path, nproc: int, sets: list[str], timeout: float = 240) -> tuple[int, str]:
    r = YardRun(recipe, out, nproc, sets)
    return r.wait(timeout), r.log


def by_rank(log: str, lines: int = 25) -> str:
    """The last `lines` lines each rank printed, rank by rank, then the launcher's own: what to
    show when a run failed (the plain tail is all the last rank's traceback, not the first
    rank's error that caused it)."""
    ranks: dict[str, list[str]] = {}
    for line in log.splitlines():
        who = line.split("]", 1)[0].lstrip() + "]" if line.lstrip().startswith("[rank ") else "launcher"
        ranks.setdefault(who, []).append(line)
    return "\n".join(f"--- {who} ---\n" + "\n".join(got[-lines:]) for who, got in sorted(ranks.items()))


def run_info(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


def rank_pids(out: Path) -> list[int]:
    try:
        return run_info(out)["pids"]
    except (OSError, ValueError, KeyError):
        return []


def records(out: Path) -> list[dict]:
    """Every line of metrics.jsonl, events included, in order."""
    lines = (out / "metrics" / "metrics.jsonl").read_text().splitlines()
    out_ = []
    for x in lines:
        try:
            out_.append(json.loads(x))
        except ValueError:  # a line cut by kill -9
            pass
    return out_


def metrics(out: Path) -> dict[int, dict]:
    """The last line logged for each step (what a resumed run's record of that step is)."""
    return {r["step"]: r for r in records(out) if "event" not in r and "step" in r}


def losses(out: Path) -> dict[int, float]:
    return {s: r["loss"] for s, r in metrics(out).items()}


def samples(out: Path, rank: int) -> dict[int, dict]:
    """The last sample-id line of each step that rank `rank` logged (log_samples=true)."""
    path = out / "metrics" / f"samples-rank{rank}.jsonl"
    return {r["step"]: r for r in map(json.loads, path.read_text().splitlines())}


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def export(run: Path, to: Path) -> dict:
    """`yard export RUN --to DIR --json`: the lineage record it prints."""
    p = subprocess.run([YARD, "export", str(run), "--to", str(to), "--json"], capture_output=True, text=True,
                       timeout=120, env=env())
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def assert_export_matches_the_checkpoint(run: Path, to: Path, family: str) -> dict:
    """The exported model's logits are those of the run's final checkpoint loaded the trainyard way."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainyard.contracts import newest_checkpoint
    from trainyard.recipes.checkpoints import saved_recipe
    from trainyard.recipes.models import build_model
    from trainyard.recipes.spec import ModelSpec
    from trainyard.recipes.train import load_weights

    lineage = export(run, to)
    assert {p.name for p in to.iterdir()} >= {"config.json", "model.safetensors", "generation_config.json",
                                              "tokenizer.json", "tokenizer_config.json", "trainyard.json"}
    step, step_dir, _ = newest_checkpoint(run / "checkpoints")
    spec = ModelSpec.model_validate(saved_recipe(run / "checkpoints")["model"])
    mine = build_model(spec, load_weights=False).eval()
    load_weights(mine, step_dir)
    theirs = AutoModelForCausalLM.from_pretrained(to, local_files_only=True).eval()
    assert theirs.config.model_type == family
    tok = AutoTokenizer.from_pretrained(to, local_files_only=True)
    ids = tok(["the model reads text while the scheduler shares the machines"], return_tensors="pt").input_ids
    with torch.no_grad():
        a, b = mine(input_ids=ids).logits, theirs(input_ids=ids).logits
    assert torch.allclose(a, b, rtol=0, atol=1e-6), (a - b).abs().max()
    parent = AutoModelForCausalLM.from_pretrained(spec.from_, local_files_only=True).eval()
    with torch.no_grad():
        assert not torch.allclose(parent(input_ids=ids).logits, b)  # trained: not the parent's weights
    assert lineage["step"] == step and lineage["parent_model"] == spec.from_ and lineage["run_id"] == run.name
    assert json.loads((to / "trainyard.json").read_text()) == lineage
    return lineage
