"""GRPO on Hugging Face checkpoints and the user's prompt/answer data, through `yard run`, and
`yard export` of the result — real processes, real files, this CPU.

- A tiny Llama on a prompt/answer jsonl ("last word: a b c" → "c") with a Python reward from a
  file (the share of the completion's characters that occur in the answer: a dense signal a
  random 44k-parameter model can climb in 30 steps), 1 process: the sampled reward and the
  greedy held-out `eval_reward` rise; the export gives the checkpoint's logits.
- A tiny Gemma under FSDP2 on 2 processes with a KL term: a SIGUSR1-interrupted run and its
  rerun equal an uninterrupted reference bit for bit (losses, rewards, KL, eval rewards, sample
  ids): the completions sampled after the resume are the same.
- The chain the issue asks for: continued pretraining from `model.from`, SFT `init_from` that
  run, GRPO (regex reward) `init_from` the SFT run — one model and tokenizer throughout — and the
  GRPO run exports.
"""

from __future__ import annotations

import json
import signal

import pytest
import yaml

from trainyard.contracts import REQUEUE_EXIT, newest_checkpoint
from tests.recipes.helpers import (YardRun, assert_export_matches_the_checkpoint, by_rank, losses, mean, metrics,
                                   records, samples, yard_run)
from tests.recipes.hf_fixtures import tiny_checkpoint, write_chat_jsonl, write_jsonl, write_prompt_jsonl

REWARD = '''
def letters(prompt, completion, answer):
    """The share of the completion's characters that occur in the answer."""
    return sum(c in answer for c in completion) / max(1, len(completion))
'''

COMMON = ["data.seq_len=32", "batch.global_batch_size=8", "rl.group_size=4", "rl.max_new_tokens=6",
          "optim.lr=1e-2", "checkpoint_every=4", "print_every=5", "data.eval_samples=16"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_rl")
    (root / "reward.py").write_text(REWARD)
    return {"llama": tiny_checkpoint(root / "llama", "llama"), "gemma": tiny_checkpoint(root / "gemma", "gemma"),
            "prompts": write_prompt_jsonl(root / "prompts.jsonl", 300), "reward": root / "reward.py", "root": root}


def python_reward(files) -> list[str]:
    return ["rl.reward=python", f"rl.reward_function={files['reward']}:letters"]


def test_grpo_of_a_llama_checkpoint_with_a_python_reward_then_export(files, tmp_path):
    out = tmp_path / "run"
    sets = [f"model.from={files['llama']}", f"data.path={files['prompts']}", *COMMON, *python_reward(files),
            "steps=30", "eval_every=10"]
    rc, log = yard_run("rl", out, 1, sets)
    assert rc == 0, log[-4000:]
    assert "300 prompts" in log and "chat template); 15 held out" in log
    m = metrics(out)
    assert sorted(m) == list(range(1, 31))
    assert all(0 < m[s]["response_tokens"] <= 6 for s in m)
    assert mean([m[s]["reward"] for s in range(21, 31)]) > mean([m[s]["reward"] for s in range(1, 11)]) + 0.05, m
    evals = {s: r["eval_reward"] for s, r in m.items() if "eval_reward" in r}
    assert sorted(evals) == [1, 10, 20, 30] and evals[30] > evals[1], evals
    cache = json.loads(next((out / "checkpoints" / "tokens").glob("*.json")).read_text())
    assert (cache["kind"], cache["documents"], cache["field"], cache["answer_field"]) == \
        ("rl", 300, "prompt", "answer")

    lineage = assert_export_matches_the_checkpoint(out, tmp_path / "exported", "llama")
    assert lineage["kind"] == "rl" and lineage["data"]["fingerprint"] == cache["key"]


STEPS = 12
GEMMA = [*COMMON, "strategy=fsdp2", f"steps={STEPS}", "log_samples=true", "eval_every=4", "rl.kl_coef=0.1"]


@pytest.mark.slow
def test_gemma_grpo_on_two_processes_resumes_bit_identical_after_sigusr1(files, tmp_path):
    sets = [f"model.from={files['gemma']}", f"data.path={files['prompts']}", *GEMMA, *python_reward(files)]
    ref = tmp_path / "reference"
    rc, log = yard_run("rl", ref, 2, sets)
    assert rc == 0, by_rank(log)
    assert "fsdp2 on 2 process(es)" in log

    out = tmp_path / "run"
    first = YardRun("rl", out, 2, sets)
    first.wait_for_step(5)
    first.proc.send_signal(signal.SIGUSR1)
    assert first.wait() == REQUEUE_EXIT, first.log[-4000:]
    stopped = max(losses(out))
    assert 5 <= stopped < STEPS and newest_checkpoint(out / "checkpoints")[0] == stopped
    rc, log = yard_run("rl", out, 2, sets)
    assert rc == 0, by_rank(log)
    assert f"resumed from step {stopped}" in log
    got, want = metrics(out), metrics(ref)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert any(want[s]["reward"] > 0 for s in want) and any(want[s]["loss"] != 0 for s in want)
    for step in range(1, STEPS + 1):
        for key in ("loss", "reward", "kl", "response_tokens", "eval_reward"):
            if key in want[step]:
                assert got[step][key].hex() == want[step][key].hex(), (step, key, got[step], want[step])
    for rank in (0, 1):
        g, w = samples(out, rank), samples(ref, rank)
        assert [g[s]["ids"] for s in range(1, STEPS + 1)] == [w[s]["ids"] for s in range(1, STEPS + 1)]
    assert [r for r in records(out) if r.get("event") == "resume"][0]["step"] == stopped


@pytest.mark.slow
def test_pretrain_then_sft_then_grpo_from_one_checkpoint_and_export(files, tmp_path):
    root = files["root"]
    text = write_jsonl(root / "text" / "corpus.jsonl", 200)
    chat = write_chat_jsonl(root / "chat" / "chat.jsonl", 100)
    cpt, sft, rl = tmp_path / "cpt", tmp_path / "sft", tmp_path / "rl"
    short = ["steps=4", "checkpoint_every=4", "batch.global_batch_size=4", "optim.lr=3e-3"]
    rc, log = yard_run("llama-pretrain", cpt, 1, [f"model.from={files['llama']}", f"data.path={text}",
                                                  "data.seq_len=32", *short])
    assert rc == 0, log[-4000:]
    rc, log = yard_run("sft", sft, 1, [f"init_from={cpt}", f"data.path={chat}", "data.seq_len=64", *short])
    assert rc == 0, log[-4000:]
    assert "the model is llama (llama, hidden 32, 2 layers, vocabulary 400)" in log
    rc, log = yard_run("rl", rl, 1, [f"init_from={sft}", f"data.path={files['prompts']}", *COMMON, *short,
                                     "rl.reward=regex", r"rl.reward_pattern=^\s*{answer}\b", "eval_every=4"])
    assert rc == 0, log[-4000:]
    for run, parent in ((sft, cpt), (rl, sft)):
        init = json.loads((run / "checkpoints" / "init_from.json").read_text())
        assert init["checkpoint"] == str(parent / "checkpoints" / "step-4") and init["step"] == 4
        recipe = yaml.safe_load((run / "checkpoints" / "recipe.yaml").read_text())
        assert recipe["model"]["from"] == str(files["llama"])  # the chain keeps model.from's model and tokenizer
    m = metrics(rl)
    assert sorted(m) == [1, 2, 3, 4] and "eval_reward" in m[4]
    lineage = assert_export_matches_the_checkpoint(rl, tmp_path / "exported", "llama")
    assert lineage["kind"] == "rl" and lineage["parent_model"] == str(files["llama"])
