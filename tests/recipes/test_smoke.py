"""Each recipe's smoke run, with real processes on this CPU: the loss falls, the reward rises.

- `gemma-pretrain` under FSDP2 (`fully_shard`, its recipe's default strategy) on 2 processes,
  killed (-9, one rank) mid-run and run again: it resumes from the newest complete checkpoint,
  recomputes the lost steps bit for bit, and its loss falls.
- The chain `llama-pretrain` (1 process) → `sft` from its checkpoint (1 process) → `rl` (GRPO)
  from the sft checkpoint (2 processes, DDP): the pretraining loss falls, the SFT loss falls and
  its greedy accuracy on held-out sums rises, and the RL reward rises.

What rises in `rl`, honestly: the reward is the exact-match rate of completions *sampled* at
temperature 1 for single-digit sums (`data.max_operand=9`), from a 0.4M-parameter model after 60
SFT steps. Part of the rise is sharpening (probability moves onto answers the model already
ranks first); the greedy held-out accuracy is logged too (eval_accuracy) and rises in this run as
well, but the test asserts only the sampled training reward, which is what GRPO optimizes.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from trainyard.contracts import newest_checkpoint
from tests.recipes.helpers import TINY_PRETRAIN, YardRun, losses, mean, metrics, records, run_info, yard_run

pytestmark = pytest.mark.slow

TINY_GEMMA = ["model.hidden_size=64", "model.intermediate_size=256", "model.num_layers=2", "model.num_heads=4",
              "model.num_kv_heads=1", "model.head_dim=16", "data.seq_len=64", "data.max_bytes=400000",
              "batch.global_batch_size=8", "optim.warmup_steps=2"]

# 0.4M parameters: big enough to learn single-digit sums in 60 SFT steps, small enough for a CPU.
PIPE_MODEL = ["model.hidden_size=128", "model.intermediate_size=344", "model.num_layers=2", "model.num_heads=4",
              "model.num_kv_heads=2"]


def test_gemma_pretrain_fsdp2_two_processes_lowers_the_loss_and_resumes_exactly_after_kill_9(tmp_path):
    out = tmp_path / "gemma"
    sets = [*TINY_GEMMA, "steps=30", "checkpoint_every=4"]
    first = YardRun("gemma-pretrain", out, 2, sets)
    first.wait_for_step(14)
    os.kill(run_info(out)["pids"][0], signal.SIGKILL)
    assert first.wait() == 128 + signal.SIGKILL, first.log[-4000:]
    assert "fsdp2 on 2 process(es)" in first.log
    resumed_from = newest_checkpoint(out / "checkpoints")[0]
    before = {r["step"]: r["loss"] for r in records(out) if "event" not in r}  # the killed attempt's steps

    rc, log = yard_run("gemma-pretrain", out, 2, sets)
    assert rc == 0, log[-4000:]
    assert f"resumed from step {resumed_from}" in log
    after = [r for r in records(out) if "event" not in r and r["attempt"] == 2]
    assert [r["step"] for r in after] == list(range(resumed_from + 1, 31))
    redone = [r for r in after if r["step"] in before]
    assert redone, "the kill came after the newest checkpoint: some steps are recomputed"
    for r in redone:  # FSDP2 shards saved and restored: the lost steps come out the same, bit for bit
        assert r["loss"].hex() == before[r["step"]].hex(), r["step"]
    loss = losses(out)
    assert mean([loss[s] for s in range(26, 31)]) < mean([loss[s] for s in range(1, 6)]) - 0.8, loss


def test_pretrain_then_sft_then_rl_lower_the_loss_and_raise_the_reward(tmp_path):
    t0 = time.monotonic()
    pre = tmp_path / "pretrain"
    rc, log = yard_run("llama-pretrain", pre, 1,
                       [*TINY_PRETRAIN, *PIPE_MODEL, "batch.global_batch_size=16", "optim.warmup_steps=5", "steps=40",
                        "checkpoint_every=20"])
    assert rc == 0, log[-4000:]
    p = losses(pre)
    assert mean([p[s] for s in range(36, 41)]) < mean([p[s] for s in range(1, 6)]) - 1.5, p
    t1 = time.monotonic()

    sft = tmp_path / "sft"
    rc, log = yard_run("sft", sft, 1, ["init_from=" + str(pre), "data.max_operand=9", "steps=60", "eval_every=30",
                                       "optim.lr=2e-3", "batch.global_batch_size=32", "checkpoint_every=30"])
    assert rc == 0, log[-4000:]
    assert "the model is" in log and "hidden 128" in log  # the architecture came from the pretrain run
    s = metrics(sft)
    assert mean([s[k]["loss"] for k in range(56, 61)]) < mean([s[k]["loss"] for k in range(1, 6)]) / 3, s
    assert s[60]["eval_accuracy"] >= s[1]["eval_accuracy"] + 0.2, (s[1]["eval_accuracy"], s[60]["eval_accuracy"])
    t2 = time.monotonic()

    rl = tmp_path / "rl"
    rc, log = yard_run("rl", rl, 2, ["init_from=" + str(sft), "data.max_operand=9", "steps=150", "eval_every=50",
                                     "optim.lr=3e-4", "optim.warmup_steps=10", "checkpoint_every=50"])
    assert rc == 0, log[-4000:]
    m = metrics(rl)
    reward = [m[k]["reward"] for k in range(1, 151)]
    early, late = mean(reward[:30]), mean(reward[-30:])
    t3 = time.monotonic()
    print(f"pretrain loss {p[1]:.3f} -> {p[40]:.3f} ({t1 - t0:.1f} s); sft loss {s[1]['loss']:.3f} -> "
          f"{s[60]['loss']:.3f}, greedy accuracy {s[1]['eval_accuracy']:.3f} -> {s[60]['eval_accuracy']:.3f} "
          f"({t2 - t1:.1f} s); rl reward (30-step means) {early:.3f} -> {late:.3f}, greedy accuracy "
          f"{m[1]['eval_accuracy']:.3f} -> {m[150]['eval_accuracy']:.3f} ({t3 - t2:.1f} s)")
    assert late > early + 0.1, (early, late)
    assert m[150]["eval_accuracy"] >= m[1]["eval_accuracy"] - 0.1  # not bought by breaking greedy answers
