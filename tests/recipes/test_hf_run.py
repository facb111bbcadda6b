"""Continued pretraining of Hugging Face checkpoints on the user's data, through `yard run`, and
`yard export` of the result — real processes, real files, this CPU.

- A tiny Llama (sharded safetensors) on a directory of JSON lines and a text file, 1 process:
  the loss falls, eval_loss on the held-out windows is logged, the token cache is in the run's
  checkpoint dir; `yard export` writes a model that `from_pretrained` loads and that gives the
  same logits as the run's final checkpoint loaded the trainyard way (DCP into the architecture).
- A tiny Gemma (tied embeddings) under FSDP2 on 2 processes: an uninterrupted reference, and a
  run stopped by SIGUSR1 to `yard run` and run again, whose per-step losses and sample ids equal
  the reference's bit for bit; the reference exports too (FSDP2 shards → one safetensors file).
"""

from __future__ import annotations

import json
import signal

import pytest

from trainyard.contracts import REQUEUE_EXIT, newest_checkpoint
from tests.recipes.helpers import (YardRun, assert_export_matches_the_checkpoint, by_rank, losses, mean, metrics,
                                   records, samples, yard_run)
from tests.recipes.hf_fixtures import tiny_checkpoint, write_jsonl

COMMON = ["data.seq_len=32", "batch.global_batch_size=8", "optim.lr=3e-3", "optim.warmup_steps=2",
          "checkpoint_every=4", "print_every=5", "data.val_fraction=0.05"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    data = root / "data"
    write_jsonl(data / "part-0.jsonl", 250, seed=3)
    write_jsonl(data / "part-1.jsonl", 250, seed=4)
    (data / "readme.txt").write_text("The scheduler shares the machines between teams.\n" * 20)
    return {"llama": tiny_checkpoint(root / "llama", "llama", shards=True),
            "gemma": tiny_checkpoint(root / "gemma", "gemma"), "data": data}


def test_continued_pretraining_of_a_llama_checkpoint_on_jsonl_and_text_then_export(files, tmp_path):
    out = tmp_path / "run"
    sets = [f"model.from={files['llama']}", f"data.path={files['data']}", *COMMON, "steps=30", "eval_every=10"]
    rc, log = yard_run("llama-pretrain", out, 1, sets)
    assert rc == 0, log[-4000:]
    assert "the model is llama (llama, hidden 32, 2 layers, vocabulary 400)" in log
    assert "3 file(s), 501 documents" in log
    m = metrics(out)
    assert sorted(m) == list(range(1, 31))
    assert mean([m[s]["loss"] for s in range(26, 31)]) < mean([m[s]["loss"] for s in range(1, 6)]) - 0.5, m
    evals = {s: r["eval_loss"] for s, r in m.items() if "eval_loss" in r}
    assert sorted(evals) == [1, 10, 20, 30] and evals[30] < evals[1] - 0.3, evals
    caches = list((out / "checkpoints" / "tokens").glob("*.json"))
    assert len(caches) == 1 and json.loads(caches[0].read_text())["documents"] == 501

    lineage = assert_export_matches_the_checkpoint(out, tmp_path / "exported", "llama")
    assert lineage["recipe"] == "llama-pretrain" and lineage["final_eval_loss"] == evals[30]
    assert lineage["data"]["documents"] == 501 and len(lineage["data"]["sha256"]) == 64
    assert lineage["data"]["fingerprint"] == json.loads(caches[0].read_text())["key"]


STEPS = 24
GEMMA = [*COMMON, "strategy=fsdp2", f"steps={STEPS}", "log_samples=true"]


@pytest.mark.slow
def test_gemma_on_two_processes_resumes_bit_identical_after_sigusr1_and_exports(files, tmp_path):
    sets = [f"model.from={files['gemma']}", f"data.path={files['data']}", *GEMMA]
    ref = tmp_path / "reference"
    rc, log = yard_run("gemma-pretrain", ref, 2, sets)
    assert rc == 0, by_rank(log)
    assert "fsdp2 on 2 process(es)" in log

    out = tmp_path / "run"
    first = YardRun("gemma-pretrain", out, 2, sets)
    first.wait_for_step(7)
    first.proc.send_signal(signal.SIGUSR1)
    assert first.wait() == REQUEUE_EXIT, first.log[-4000:]
    stopped = max(losses(out))
    assert 7 <= stopped < STEPS and newest_checkpoint(out / "checkpoints")[0] == stopped
    rc, log = yard_run("gemma-pretrain", out, 2, sets)
    assert rc == 0, by_rank(log)
    assert f"resumed from step {stopped}" in log
    got, want = losses(out), losses(ref)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert got[step].hex() == want[step].hex(), (step, got[step], want[step])
    for rank in (0, 1):
        g, w = samples(out, rank), samples(ref, rank)
        assert [g[s]["ids"] for s in range(1, STEPS + 1)] == [w[s]["ids"] for s in range(1, STEPS + 1)]
    assert [r for r in records(out) if r.get("event") == "resume"][0]["step"] == stopped

    assert_export_matches_the_checkpoint(ref, tmp_path / "exported", "gemma")
