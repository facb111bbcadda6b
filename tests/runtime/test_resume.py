"""Exact resume with real processes: SIGUSR1 at an arbitrary step, kill -9 of one rank, 2 → 1 ranks.

The reference is an uninterrupted 2-rank run under plain torchrun. Every other run is launched
rank by rank (as trainyard's local backend does), interrupted, and run again as the next
attempt; its per-step losses (exact hex floats) and sample ids must equal the reference's.
"""

from __future__ import annotations

import json
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from trainyard.contracts import REQUEUE_EXIT, newest_checkpoint
from trainyard.runtime import ResumableSampler, read_metrics
from tests.runtime.helpers import Ranks, final_by_step, torchrun, trace, wait_for

STEPS = 30
ARGS = ["--steps", str(STEPS), "--checkpoint-every", "5"]
# The tests of the module-scoped reference run on one xdist worker (`make test`'s --dist loadgroup):
# unmarked, each worker they land on runs its own reference torchrun.
SAME_REFERENCE = pytest.mark.xdist_group("runtime-resume-reference")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    assert torchrun(out, 2, ARGS) == 0, (out / "log-a0-torchrun.txt").read_text()[-3000:]
    return out


def assert_same_as_reference(out: Path, ref: Path) -> None:
    for rank in (0, 1):
        got, want = final_by_step(out, rank), final_by_step(ref, rank)
        assert sorted(got) == list(range(1, STEPS + 1))
        for step in range(1, STEPS + 1):
            assert got[step]["ids"] == want[step]["ids"], f"rank {rank} step {step}: other samples"
            assert got[step]["loss"] == want[step]["loss"], f"rank {rank} step {step}: loss differs"
    # metrics.jsonl (rank 0's view): the same losses, one final record per step
    got_m, want_m = read_metrics(out / "metrics"), read_metrics(ref / "metrics")
    assert [got_m[s]["loss"] for s in range(1, STEPS + 1)] == [want_m[s]["loss"] for s in range(1, STEPS + 1)]


@SAME_REFERENCE
def test_reference_metrics(reference):
    m = read_metrics(reference / "metrics")
    assert sorted(m) == list(range(1, STEPS + 1))
    rec = m[STEPS]
    for key in ("loss", "lr", "step_time_s", "samples_per_s", "samples", "time", "attempt"):
        assert key in rec, key
    assert rec["samples"] == 8 * STEPS
    events = [json.loads(x) for x in (reference / "metrics" / "metrics.jsonl").read_text().splitlines()]
    # The first save at step 5; then each starts early enough that no step boundary leaves more
    # than 5 steps uncommitted (the cadence counts commit lag); the last one is the final step.
    saved = [e["step"] for e in events if e.get("event") == "checkpoint"]
    assert saved[0] == 5 and saved[-1] == STEPS and saved == sorted(set(saved))
    assert all(b - a <= 5 for a, b in zip(saved, saved[1:])), saved
    assert events[-1]["event"] == "finished"
    # retention: keep_last 3
    assert sorted(int(p.name.split("-")[1]) for p in (reference / "ckpt").iterdir()) == saved[-3:]


@SAME_REFERENCE
def test_sigusr1_to_one_rank_all_checkpoint_same_step_exit_75_then_exact_resume(reference, tmp_path):
    out = tmp_path / "job"
    first = Ranks(out, 2, [*ARGS, "--step-sleep", "0.05", "--marker-at", "12"])
    wait_for(out / "reached-12-rank1", first)
    first.signal(1, signal.SIGUSR1)  # the notice reaches one rank only: both must agree
    assert first.wait() == [REQUEUE_EXIT, REQUEUE_EXIT], first.log(0)[-2000:] + first.log(1)[-2000:]
    last = [trace(out, r)[-1]["step"] for r in (0, 1)]
    assert last[0] == last[1] and 12 <= last[0] < STEPS
    found = newest_checkpoint(out / "ckpt")
    assert found is not None and found[0] == last[0]  # checkpointed exactly where both stopped
    assert "preemption (SIGUSR1)" in first.log(1) and "preemption (another rank's notice)" in first.log(0)

    second = Ranks(out, 2, ARGS, attempt=1)
    assert second.wait() == [0, 0], second.log(0)[-3000:]
    assert f"resumed from step {last[0]}" in second.log(0)
    assert_same_as_reference(out, reference)
    resume = [json.loads(x) for x in (out / "metrics" / "metrics.jsonl").read_text().splitlines()
              if '"resume"' in x]
    assert resume and resume[0]["step"] == last[0] and resume[0]["discarded_steps"] == 0


@SAME_REFERENCE
def test_kill_9_of_one_rank_then_rerun_resumes_from_newest_complete(reference, tmp_path):
    out = tmp_path / "job"
    first = Ranks(out, 2, [*ARGS, "--step-sleep", "0.05", "--marker-at", "17"])
    wait_for(out / "reached-17-rank0", first)
    first.signal(1, signal.SIGKILL)
    codes = first.wait(timeout=120)
    assert codes[1] == -signal.SIGKILL and codes[0] not in (0, REQUEUE_EXIT)
    found = newest_checkpoint(out / "ckpt")
    done_before = trace(out, 0)[-1]["step"]
    # the work lost is at most one checkpoint interval (5), async commits included
    assert found is not None and done_before - 5 <= found[0] <= done_before, (found, done_before)

    second = Ranks(out, 2, ARGS, attempt=1)
    assert second.wait() == [0, 0], second.log(0)[-3000:]
    assert f"resumed from step {found[0]}" in second.log(0)
    assert_same_as_reference(out, reference)
    resume = [json.loads(x) for x in (out / "metrics" / "metrics.jsonl").read_text().splitlines()
              if '"resume"' in x][0]
    assert resume["discarded_steps"] == done_before - found[0]  # the recomputed work, measured


class _Recorder(BaseHTTPRequestHandler):
    posts: list = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).posts.append((self.path, self.headers.get("Authorization"), json.loads(body)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *a):
        pass


def test_resume_on_one_process_after_two_continues_global_sample_order(tmp_path):
    out = tmp_path / "job"
    first = Ranks(out, 2, ["--steps", "10", "--checkpoint-every", "5"])
    assert first.wait() == [0, 0], first.log(0)[-3000:]

    _Recorder.posts = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        api = {"TRAINYARD_API": f"http://127.0.0.1:{server.server_port}", "TRAINYARD_JOB_ID": "7",
               "TRAINYARD_TOKEN": "tok"}
        second = Ranks(out, 1, ["--steps", "20", "--checkpoint-every", "5"], attempt=1, env=api)
        assert second.wait() == [0], second.log(0)[-3000:]
    finally:
        server.shutdown()
    assert "written by 2 ranks, this run has 1" in second.log(0)

    # The global order: rank 0's slice then rank 1's while two ran, then the single rank's.
    two = [final_by_step(out, 0), final_by_step(out, 1)]
    got = []
    for step in range(1, 21):
        if step <= 10:
            assert two[0][step]["world"] == 2
            got += two[0][step]["ids"] + two[1][step]["ids"]
        else:
            assert two[0][step]["world"] == 1
            got += two[0][step]["ids"]
    want_sampler = ResumableSampler(64, 8, seed=7)
    want = []
    for _ in range(20):
        want += want_sampler.global_batch()
        want_sampler.advance()
    assert got == want
    for epoch in range(2):  # 8 steps of 8 = one epoch of 64: each sample exactly once
        assert sorted(got[epoch * 64:(epoch + 1) * 64]) == list(range(64))
    assert len(set(got[128:])) == 32  # half of epoch 2, no repeats

    # progress reports (rank 0 only): resume, checkpoints, finished; bearer token; the job's URL
    assert {p for p, _, _ in _Recorder.posts} == {"/api/v1/jobs/7/progress"}
    assert {a for _, a, _ in _Recorder.posts} == {"Bearer tok"}
    events = [(b["event"], b["step"]) for _, _, b in _Recorder.posts]
    assert events[0] == ("resume", 10) and events[-1] == ("finished", 20)
    assert ("checkpoint", 15) in events and ("checkpoint", 20) in events
    fin = _Recorder.posts[-1][2]
    assert fin["last_checkpoint_step"] == 20 and fin["attempt"] == 1 and "loss" in fin["metrics"]
