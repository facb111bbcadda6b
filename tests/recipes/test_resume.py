"""Exact resume of `llama-pretrain` through `yard run`, with real processes (2 ranks, DDP, CPU).

The reference is one uninterrupted 2-process run. The other runs are interrupted — SIGUSR1 to
`yard run` at an arbitrary step, `kill -9` of one rank — and run again with the same command and
out dir; their per-step losses in metrics.jsonl (the last line of each step) must equal the
reference's bit for bit (JSON floats round-trip exactly), and so must the sample ids each rank
trained on. Then the reference's out dir is continued on 1 process: the global sample order goes
on where 2 processes left it.
"""

from __future__ import annotations

import os
import shutil
import signal

import pytest

from trainyard.contracts import REQUEUE_EXIT, newest_checkpoint
from trainyard.recipes import load_recipe
from trainyard.runtime import ResumableSampler
from tests.recipes.helpers import TINY_PRETRAIN, YardRun, by_rank, losses, metrics, records, run_info, samples, yard_run

STEPS = 40
RUN = [*TINY_PRETRAIN, f"steps={STEPS}", "checkpoint_every=4", "log_samples=true"]

pytestmark = pytest.mark.slow
# The tests of the module-scoped reference run on one xdist worker (`make test`'s --dist loadgroup):
# unmarked, each worker they land on runs its own reference (three 2-rank runs in the full suite).
SAME_REFERENCE = pytest.mark.xdist_group("recipes-resume-reference")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "run"
    rc, log = yard_run("llama-pretrain", out, 2, RUN)
    assert rc == 0, by_rank(log)
    return out


def assert_identical(out, ref) -> None:
    got, want = losses(out), losses(ref)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert got[step].hex() == want[step].hex(), f"step {step}: loss {got[step]!r} != {want[step]!r}"
    for rank in (0, 1):
        g, w = samples(out, rank), samples(ref, rank)
        assert [g[s]["ids"] for s in range(1, STEPS + 1)] == [w[s]["ids"] for s in range(1, STEPS + 1)], rank


@SAME_REFERENCE
def test_reference_run_lowers_the_loss_and_checkpoints(reference):
    m = metrics(reference)
    assert sorted(m) == list(range(1, STEPS + 1))
    first, last = m[1]["loss"], m[STEPS]["loss"]
    assert last < first - 1.0, (first, last)  # ~5.5 (uniform over 264 tokens) → ~3
    assert m[STEPS]["samples"] == 8 * STEPS and m[STEPS]["tokens"] == 8 * 64 * STEPS
    saved = [r["step"] for r in records(reference) if r.get("event") == "checkpoint"]
    # every 4 steps at most: the cadence starts a save early when its commit takes steps
    assert saved[0] == 4 and saved[-1] == STEPS and all(0 < b - a <= 4 for a, b in zip(saved, saved[1:])), saved
    assert newest_checkpoint(reference / "checkpoints")[0] == STEPS
    assert (reference / "checkpoints" / "recipe.yaml").is_file()
    assert (reference / "logs" / "rank-1.log").is_file() and run_info(reference)["attempt"] == 1


@SAME_REFERENCE
def test_sigusr1_to_yard_run_exits_75_and_the_rerun_is_bit_identical(reference, tmp_path):
    out = tmp_path / "run"
    first = YardRun("llama-pretrain", out, 2, RUN)
    first.wait_for_step(9)
    first.proc.send_signal(signal.SIGUSR1)  # to `yard run` only: it forwards the notice to every rank
    assert first.wait() == REQUEUE_EXIT, first.log[-4000:]
    stopped = max(losses(out))
    assert 9 <= stopped < STEPS
    assert newest_checkpoint(out / "checkpoints")[0] == stopped  # checkpointed where both ranks stopped
    assert first.log.count("got SIGUSR1") == 2  # each rank got the notice

    rc, log = yard_run("llama-pretrain", out, 2, RUN)  # the same command again
    assert rc == 0, by_rank(log)
    assert f"resumed from step {stopped}" in log
    assert_identical(out, reference)
    resume = [r for r in records(out) if r.get("event") == "resume"]
    assert len(resume) == 1 and resume[0]["step"] == stopped and resume[0]["discarded_steps"] == 0
    assert run_info(out)["attempt"] == 2 and {r["attempt"] for r in metrics(out).values()} == {1, 2}


@SAME_REFERENCE
def test_kill_9_of_one_rank_then_rerun_resumes_from_the_newest_complete_checkpoint(reference, tmp_path):
    out = tmp_path / "run"
    first = YardRun("llama-pretrain", out, 2, RUN)
    first.wait_for_step(18)
    os.kill(run_info(out)["pids"][1], signal.SIGKILL)
    assert first.wait() == 128 + signal.SIGKILL, first.log[-4000:]
    assert "rank 1 was killed by SIGKILL" in first.log
    found = newest_checkpoint(out / "checkpoints")
    assert found is not None and found[0] >= 12
    done_before = max(losses(out))

    rc, log = yard_run("llama-pretrain", out, 2, RUN)
    assert rc == 0, by_rank(log)
    assert f"resumed from step {found[0]}" in log
    assert_identical(out, reference)
    resume = [r for r in records(out) if r.get("event") == "resume"][0]
    assert resume["discarded_steps"] == done_before - found[0]  # the recomputed steps, measured


@SAME_REFERENCE
def test_resume_on_one_process_after_two_continues_the_global_sample_order(reference, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    more = STEPS + 12
    rc, log = yard_run("llama-pretrain", out, 1, [*RUN, f"steps={more}"])
    assert rc == 0, by_rank(log)
    assert f"resumed from step {STEPS}" in log and "written by 2 ranks, this run has 1" in log

    two = [samples(out, 0), samples(out, 1)]
    got: list[int] = []
    for step in range(1, more + 1):
        if step <= STEPS:
            assert two[0][step]["world"] == 2
            got += two[0][step]["ids"] + two[1][step]["ids"]  # rank 0's slice, then rank 1's
        else:
            assert two[0][step]["world"] == 1
            got += two[0][step]["ids"]
    spec = load_recipe("llama-pretrain", RUN)
    from trainyard.recipes.data import stdlib_corpus

    n = len(stdlib_corpus(spec.data))
    want_sampler = ResumableSampler(n, 8, seed=spec.seed)
    want: list[int] = []
    for _ in range(more):
        want += want_sampler.global_batch()
        want_sampler.advance()
    assert got == want  # the same global order: nothing skipped, nothing repeated
    assert len(got) < n and len(set(got)) == len(got)
    assert metrics(out)[more]["samples"] == 8 * more


@pytest.mark.slow
def test_a_preempted_four_rank_run_resumes_bit_identical(tmp_path):
    """With more than two ranks the all-reduce's summation order depends on DDP's bucket layout;
    the first step after a resume must sum like the uninterrupted run (`strategies.wrap`)."""
    run = [*TINY_PRETRAIN, "steps=16", "checkpoint_every=4"]
    rc, log = yard_run("llama-pretrain", tmp_path / "ref", 4, run)
    assert rc == 0, by_rank(log)
    out = tmp_path / "run"
    first = YardRun("llama-pretrain", out, 4, run)
    first.wait_for_step(6)
    first.proc.send_signal(signal.SIGUSR1)
    assert first.wait() == REQUEUE_EXIT, first.log[-4000:]
    stopped = max(losses(out))
    assert stopped < 16
    rc, log = yard_run("llama-pretrain", out, 4, run)
    assert rc == 0, by_rank(log)
    assert f"resumed from step {stopped}" in log
    assert losses(out) == losses(tmp_path / "ref")
