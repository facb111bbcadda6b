"""SFT of Hugging Face checkpoints on the user's chat data, through `yard run`, and `yard export`
of the result — real processes, real files, this CPU.

- A tiny Llama (random weights, a BPE and a chat template trained and written at test time) on
  a chat-format jsonl, 1 process: the loss on the assistant tokens falls, eval_loss on the
  held-out conversations is logged and falls, the token cache is in the run's checkpoint dir,
  the recipe records `data.field: messages`; the exported model loads with `from_pretrained`,
  gives the checkpoint's logits, and its tokenizer renders chats with the same template.
- A tiny Gemma (tied embeddings) under FSDP2 on 2 processes: an uninterrupted reference, and a
  run stopped by SIGUSR1 to `yard run` and run again, whose per-step losses, eval losses and
  sample ids equal the reference's bit for bit; the reference exports too.
"""

from __future__ import annotations

import json
import signal

import pytest
import yaml

from trainyard.contracts import REQUEUE_EXIT, newest_checkpoint
from tests.recipes.helpers import (YardRun, assert_export_matches_the_checkpoint, by_rank, losses, mean, metrics,
                                   records, samples, yard_run)
from tests.recipes.hf_fixtures import conversation, tiny_checkpoint, write_chat_jsonl

COMMON = ["data.seq_len=64", "batch.global_batch_size=8", "optim.lr=3e-3", "optim.warmup_steps=2",
          "checkpoint_every=4", "print_every=5"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_sft")
    return {"llama": tiny_checkpoint(root / "llama", "llama"), "gemma": tiny_checkpoint(root / "gemma", "gemma"),
            "chat": write_chat_jsonl(root / "chat.jsonl", 300)}


def test_sft_of_a_llama_checkpoint_on_chat_jsonl_then_export(files, tmp_path):
    out = tmp_path / "run"
    sets = [f"model.from={files['llama']}", f"data.path={files['chat']}", *COMMON, "steps=30", "eval_every=10"]
    rc, log = yard_run("sft", out, 1, sets)
    assert rc == 0, log[-4000:]
    assert "the model is llama (llama, hidden 32, 2 layers, vocabulary 400)" in log
    assert "300 conversations" in log and "chat template); 15 held out" in log
    assert "starts from a random model" not in log
    m = metrics(out)
    assert sorted(m) == list(range(1, 31))
    assert mean([m[s]["loss"] for s in range(26, 31)]) < mean([m[s]["loss"] for s in range(1, 6)]) - 0.5, m
    evals = {s: r["eval_loss"] for s, r in m.items() if "eval_loss" in r}
    assert sorted(evals) == [1, 10, 20, 30] and evals[30] < evals[1] - 0.5, evals
    caches = list((out / "checkpoints" / "tokens").glob("*.json"))
    assert len(caches) == 1
    cache = json.loads(caches[0].read_text())
    assert (cache["kind"], cache["documents"], cache["field"], cache["chat_template"]) == ("sft", 300, "messages", True)
    recipe = yaml.safe_load((out / "checkpoints" / "recipe.yaml").read_text())
    assert recipe["data"]["field"] == "messages" and recipe["model"]["from"] == str(files["llama"])

    exported = tmp_path / "exported"
    lineage = assert_export_matches_the_checkpoint(out, exported, "llama")
    assert lineage["kind"] == "sft" and lineage["final_eval_loss"] == evals[30]
    assert lineage["data"]["documents"] == 300 and lineage["data"]["fingerprint"] == cache["key"]
    from transformers import AutoTokenizer

    mine, theirs = (AutoTokenizer.from_pretrained(d, local_files_only=True) for d in (files["llama"], exported))
    chat = conversation(7)
    assert theirs.apply_chat_template(chat, tokenize=False) == mine.apply_chat_template(chat, tokenize=False)


STEPS = 16
GEMMA = [*COMMON, "strategy=fsdp2", f"steps={STEPS}", "log_samples=true", "eval_every=5"]


@pytest.mark.slow
def test_gemma_sft_on_two_processes_resumes_bit_identical_after_sigusr1_and_exports(files, tmp_path):
    sets = [f"model.from={files['gemma']}", f"data.path={files['chat']}", *GEMMA]
    ref = tmp_path / "reference"
    rc, log = yard_run("sft", ref, 2, sets)
    assert rc == 0, by_rank(log)
    assert "fsdp2 on 2 process(es)" in log

    out = tmp_path / "run"
    first = YardRun("sft", out, 2, sets)
    first.wait_for_step(5)
    first.proc.send_signal(signal.SIGUSR1)
    assert first.wait() == REQUEUE_EXIT, first.log[-4000:]
    stopped = max(losses(out))
    assert 5 <= stopped < STEPS and newest_checkpoint(out / "checkpoints")[0] == stopped
    rc, log = yard_run("sft", out, 2, sets)
    assert rc == 0, by_rank(log)
    assert f"resumed from step {stopped}" in log
    got, want = metrics(out), metrics(ref)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        for key in ("loss", "eval_loss"):
            if key in want[step]:
                assert got[step][key].hex() == want[step][key].hex(), (step, key, got[step], want[step])
    for rank in (0, 1):
        g, w = samples(out, rank), samples(ref, rank)
        assert [g[s]["ids"] for s in range(1, STEPS + 1)] == [w[s]["ids"] for s in range(1, STEPS + 1)]
    assert [r for r in records(out) if r.get("event") == "resume"][0]["step"] == stopped

    assert_export_matches_the_checkpoint(ref, tmp_path / "exported", "gemma")
