"""The exit-code contract, rule by rule (pure: `outcome.classify` on made-up facts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainyard.backends.base import AttemptState, RankState
from trainyard.services.ranks import ranks_for
from trainyard.control.rules.outcome import classify


def att(*ranks: tuple) -> AttemptState:
    out = []
    for i, r in enumerate(ranks):
        code, sig, lost = (r + (None, None, False))[:3] if isinstance(r, tuple) else (r, None, False)
        out.append(RankState(i, 100 + i, False, code, sig, lost))
    return AttemptState(1, 1, out)


@pytest.mark.parametrize("facts, stop, state, attempt_state", [
    (att(0, 0), None, "COMPLETED", "COMPLETED"),
    (att(75, 0), None, "REQUEUED", "REQUEUED"),
    (att(3, 0), None, "FAILED", "FAILED"),
    (att((None, 9)), None, "FAILED", "FAILED"),
    (att((None, None, True)), None, "NODE_FAIL", "NODE_FAIL"),
    (att((None, 15), (None, 15)), "cancel", "CANCELLED", "CANCELLED"),
    (att((None, 15)), "timeout", "TIMEOUT", "TIMEOUT"),
    (att(75, 75), "preempt", "REQUEUED", "PREEMPTED"),
    (att((None, 9)), "preempt", "REQUEUED", "PREEMPTED"),
    (att(0, 0), "preempt", "COMPLETED", "COMPLETED"),  # finished during its grace period
    (att(75), "requeue", "REQUEUED", "REQUEUED"),
    (att(86, (None, 15)), "failed", "FAILED", "FAILED"),
])
def test_state_after_an_attempt(facts, stop, state, attempt_state, tmp_path: Path):
    out = classify(facts, stop, tmp_path)
    assert (out.job_state, out.attempt_state) == (state, attempt_state)


def test_the_failed_rank_is_blamed_not_the_ones_stopped_after_it(tmp_path: Path):
    out = classify(att((None, 15), 4, (None, 15)), "failed", tmp_path)
    assert out.exit_code == 4 and "rank 1" in out.reason


def test_out_of_memory_is_read_from_the_rank_log(tmp_path: Path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank-1.log").write_text("...\ntorch.OutOfMemoryError: CUDA out of memory. Tried ...\n")
    assert classify(att(0, 1), None, tmp_path).job_state == "OUT_OF_MEMORY"


def test_a_rank_the_kernel_oom_killed_is_out_of_memory_with_no_log_marker(tmp_path: Path):
    # SIGKILL from the OOM killer, before the first step: the backend's fact wins over
    # "user error" and "crash"; the log says nothing of it.
    facts = AttemptState(1, 1, [RankState(0, 100, False, 0, None),
                                RankState(1, 101, False, None, 9, oom_killed=True)])
    out = classify(facts, None, tmp_path)
    assert (out.job_state, out.cause, out.signal) == ("OUT_OF_MEMORY", "oom", 9) and "rank 1" in out.reason


def test_a_rank_ended_at_the_pids_limit_fails_naming_the_limit_and_is_not_retried(tmp_path: Path):
    # The runner ended rank 1 (SIGKILL) when its fork was refused; rank 0 was stopped after it.
    facts = AttemptState(1, 1, [RankState(0, 100, False, None, 15),
                                RankState(1, 101, False, None, 9, pids_max_hit=True, pids_max=256)])
    out = classify(facts, "failed", tmp_path, made_progress=True)
    assert (out.job_state, out.attempt_state, out.cause, out.signal) == ("FAILED", "FAILED", "pids", 9)
    assert out.reason == "pids limit: rank 1 hit the job's limit of 256 processes (pids_max)"
    from trainyard.control.rules.outcome import RETRYABLE
    assert out.cause not in RETRYABLE  # a fork bomb would only do it again


def _preempted_record(job_dir: Path, attempt: int, step: int, committed: bool = True) -> None:
    (job_dir / "metrics").mkdir(exist_ok=True)
    with open(job_dir / "metrics" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "loss": 1.0, "attempt": attempt}) + "\n")
        f.write(json.dumps({"event": "preempted", "step": step, "attempt": attempt, "checkpoint_step": step}) + "\n")
    (job_dir / "checkpoints" / f"step-{step}").mkdir(parents=True, exist_ok=True)
    if committed:
        (job_dir / "checkpoints" / f"step-{step}" / "COMMITTED").write_text("{}")


def test_a_launcher_that_exits_1_over_checkpointed_workers_is_requeued_by_the_runtimes_record(tmp_path: Path):
    # torchrun's agent exits 1 when its workers exit 75: the runtime's record decides.
    _preempted_record(tmp_path, 1, 20)
    out = classify(att(1), "requeue", tmp_path)
    assert (out.job_state, out.attempt_state) == ("REQUEUED", "REQUEUED") and "checkpointed step 20" in out.reason
    out = classify(att(1), None, tmp_path)  # a notice from elsewhere (an operator's kill -USR1)
    assert (out.job_state, out.cause) == ("REQUEUED", "requeued") and "the launcher exited 1" in out.reason


def test_the_runtimes_record_counts_only_for_its_attempt_and_a_committed_checkpoint(tmp_path: Path):
    _preempted_record(tmp_path, 1, 20, committed=False)
    assert "without a checkpoint" in classify(att(1), "requeue", tmp_path).reason
    assert classify(att(1), None, tmp_path).job_state == "FAILED"
    _preempted_record(tmp_path, 2, 30)
    assert classify(AttemptState(1, 3, att(1).ranks), None, tmp_path).job_state == "FAILED"  # another attempt's
    with open(tmp_path / "metrics" / "metrics.jsonl", "a") as f:  # attempt 2 carried on after its record
        f.write(json.dumps({"step": 31, "loss": 1.0, "attempt": 2}) + "\n")
    assert classify(AttemptState(1, 2, att(1).ranks), None, tmp_path).job_state == "FAILED"


def test_a_record_whose_attempt_is_true_or_a_float_is_not_attempt_1s(tmp_path: Path):
    _preempted_record(tmp_path, 7, 20)  # committed step 20, then records that only look like attempt 1's
    with open(tmp_path / "metrics" / "metrics.jsonl", "a") as f:
        for fake in (True, 1.0):
            f.write(json.dumps({"event": "preempted", "step": 20, "attempt": fake, "checkpoint_step": 20}) + "\n")
    assert classify(att(1), None, tmp_path).job_state == "FAILED"


def test_a_job_without_the_runtime_is_told_by_its_exit_code_or_signal_and_not_retried(tmp_path: Path):
    from trainyard.control.rules.outcome import RETRYABLE
    out = classify(att(0, 3), None, tmp_path, plain=True)
    assert (out.job_state, out.cause, out.reason) == ("FAILED", "exit_code", "NonZeroExitCode 3 on rank 1")
    out = classify(att((None, 11)), None, tmp_path, plain=True)
    assert (out.cause, out.signal) == ("signal", 11) and out.reason.startswith("Signal SIGSEGV on rank 0")
    assert classify(att(127), None, tmp_path, plain=True).cause == "user_error"  # command not found, still
    assert "first step" in classify(att(3), None, tmp_path).reason  # a runtime job's failure before it
    assert {"exit_code", "signal"}.isdisjoint(RETRYABLE)


def test_the_classs_requeue_exit_codes_retry_an_attempt(tmp_path: Path):
    from trainyard.control.rules.outcome import RETRYABLE
    out = classify(att(0, 42), None, tmp_path, plain=True, requeue_exit=(42,))
    assert (out.cause, out.exit_code) == ("requeue_exit", 42) and "RequeueExit" in out.reason
    assert out.cause in RETRYABLE
    assert classify(att(0, 43), None, tmp_path, plain=True, requeue_exit=(42,)).cause == "exit_code"


def test_ranks_are_one_per_gpu_or_tasks_per_node():
    placement = [{"node": "a", "gpus": [0, 1, 2, 3]}, {"node": "b", "gpus": [4, 5, 6, 7]}]
    one_per_gpu = ranks_for(placement, None)
    assert [(r.rank, r.node, r.gpus) for r in one_per_gpu][:2] == [(0, "a", (0,)), (1, "a", (1,))]
    assert len(one_per_gpu) == 8
    per_node = ranks_for(placement, 1)
    assert [(r.rank, r.node, r.gpus) for r in per_node] == [(0, "a", (0, 1, 2, 3)), (1, "b", (4, 5, 6, 7))]
    assert [r.gpus for r in ranks_for(placement, 2)] == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_a_watchdog_exit_is_told_apart_from_a_crash(tmp_path: Path):
    out = classify(att(0, 86), None, tmp_path)
    assert out.job_state == "FAILED" and out.reason.startswith("Hung") and out.exit_code == 86


def test_a_watchdog_exit_is_the_cause_when_a_peer_failed_on_the_closed_connection(tmp_path):
    # The hung rank's watchdog fired first; its peer, blocked in the all-reduce, saw the
    # connection close (exit 1) before its own watchdog fired: a hang, not a crash.
    out = classify(att(1, 86), None, tmp_path, made_progress=True)
    assert out.cause == "hung" and out.exit_code == 86 and "rank 1" in out.reason


def test_a_lost_rank_is_blamed_not_the_ones_stopped_after_it(tmp_path: Path):
    out = classify(att((None, 15), (None, None, True)), "failed", tmp_path, made_progress=True)
    assert out.cause == "node_lost" and "rank 1" in out.reason


def test_a_lost_rank_is_blamed_over_peers_that_crashed_because_of_it(tmp_path: Path):
    out = classify(att(1, (None, None, True)), None, tmp_path, made_progress=True)
    assert out.cause == "node_lost"


# -- honest blame (issue 34, point 7): the plane's own stop signals are never the cause ------------

TERM, KILL, ABRT = 15, 9, 6


def test_a_rank_killed_from_outside_is_blamed_not_the_plane_stopping_the_others(tmp_path: Path):
    # rank 1 was SIGKILLed by someone else; the plane then stopped rank 0 with SIGTERM
    facts = att((None, TERM), (None, KILL))
    out = classify(facts, "failed", tmp_path, sent={TERM}, first=1)
    assert (out.cause, out.signal) == ("crash", KILL)
    assert out.reason == "Signal SIGKILL on rank 1 (not sent by trainyard)"
    # without the recorded first failure (an older plane's stop), the signal the plane did not send still decides
    assert classify(facts, "failed", tmp_path, sent={TERM}).reason == "Signal SIGKILL on rank 1 (not sent by trainyard)"
    # a shell's exit 143 after the plane's SIGTERM is the plane's doing too
    assert "rank 1" in classify(att(143, (None, KILL)), "failed", tmp_path, sent={TERM}).reason


def test_the_rank_that_failed_before_the_plane_signalled_is_the_cause_whatever_the_others_die_of(tmp_path: Path):
    # the stop reached SIGKILL, so both ranks' SIGKILLs could be the plane's: the recorded one is the cause
    facts = att((None, KILL), (None, KILL))
    out = classify(facts, "failed", tmp_path, made_progress=True, sent={TERM, KILL}, first=1)
    assert out.reason == "Signal SIGKILL on rank 1 (not sent by trainyard)"
    # rank 1 exited 1 first; its peer's NCCL watchdog then aborted (SIGABRT, not the plane's): rank 1 is the cause
    out = classify(att((None, ABRT), 1), "failed", tmp_path, made_progress=True, sent={TERM}, first=1)
    assert (out.exit_code, out.cause) == (1, "crash") and "rank 1" in out.reason
    # seen in the same pass (no first): an exit code still comes before a signal the plane did not send
    assert "rank 1" in classify(att((None, ABRT), 1), None, tmp_path, made_progress=True, sent=set()).reason



def test_an_exit_126_that_is_a_refused_permission_says_so(tmp_path: Path):
    # A batch script whose `srun` could not execute its interpreter (a shell's EACCES, exit 126):
    # the reason says "permission denied" and quotes the line, never "command not found".
    assert "command not executable" in classify(att(126), None, tmp_path, plain=True).reason
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank-0.log").write_text(
        "starting\n/x/bin/srun: 7: exec: /root/.venv/bin/python: Permission denied\n")
    out = classify(att(126), None, tmp_path, plain=True)
    assert out.cause == "user_error" and out.reason.startswith("UserError: permission denied (exit 126 on rank 0)")
    assert out.reason.endswith("/root/.venv/bin/python: Permission denied")
