"""Lost work is training time since the last checkpoint, read from the job's step records, not the
wall time to when the plane noticed (frozen ranks and a plane that was down are not work)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainyard.control.rules import lost_work
from trainyard.control.rules.lost_work import last_steps, lost_work_s


def write(job: Path, records: list[dict]) -> None:
    (job / "metrics").mkdir(parents=True, exist_ok=True)
    (job / "metrics" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def steps(attempt: int, first: int, last: int, t0: float, step_s: float = 1.0) -> list[dict]:
    return [{"step": s, "time": t0 + (s - first + 1) * step_s, "attempt": attempt, "loss": 1.0, "step_time_s": step_s}
            for s in range(first, last + 1)]


def test_a_frozen_job_loses_its_steps_since_the_checkpoint_and_one_step_in_progress_not_the_frozen_time(tmp_path):
    # attempt 1 started at 100, steps 1..13 end at 101..113, checkpoint of step 10 committed at 110.5;
    # the ranks froze after step 13 and the plane ended the attempt at 160
    write(tmp_path, steps(1, 1, 13, 100.0))
    lost = lost_work_s(tmp_path, 1, start_time=100.0, checkpoint=(10, 110.5), now=160.0)
    assert lost == pytest.approx(113.0 + 1.0 - 110.0)  # from the end of step 10


def test_an_attempt_that_checkpointed_its_last_step_lost_nothing(tmp_path):
    write(tmp_path, [*steps(1, 1, 17, 100.0), {"event": "preempted", "step": 17, "attempt": 1, "time": 117.2}])
    assert lost_work_s(tmp_path, 1, start_time=100.0, checkpoint=(17, 117.3), now=130.0) == 0.0


def test_only_this_attempts_steps_count(tmp_path):
    # attempt 2 resumed at step 10 (its own checkpoint: none yet) and did steps 11..12
    write(tmp_path, [*steps(1, 1, 13, 100.0), *steps(2, 11, 12, 200.0)])
    lost = lost_work_s(tmp_path, 2, start_time=199.0, checkpoint=None, now=202.5)
    assert lost == pytest.approx(202.0 + 0.5 - 199.0)  # start-up, steps 11, 12, half of step 13


def test_a_job_without_step_records_falls_back_to_wall_time(tmp_path):
    assert lost_work_s(tmp_path, 1, start_time=100.0, checkpoint=(5, 130.0), now=150.0) == 20.0
    assert lost_work_s(tmp_path, 1, start_time=100.0, checkpoint=None, now=150.0) == 50.0


def test_the_tail_of_a_long_file_is_enough_and_a_cut_or_bad_line_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(lost_work, "TAIL_BYTES", 2000)
    write(tmp_path, steps(1, 1, 500, 0.0))
    with open(tmp_path / "metrics" / "metrics.jsonl", "a") as fh:
        fh.write("{not json\n")
    got = last_steps(tmp_path / "metrics" / "metrics.jsonl", 1)
    assert got and got[-1]["step"] == 500 and [r["step"] for r in got] == list(range(got[0]["step"], 501))


def test_an_async_checkpoint_counts_from_the_step_it_holds_not_from_its_commit(tmp_path):
    # step 10 finished at 110; its checkpoint committed at 112.5, during step 13
    write(tmp_path, steps(1, 1, 14, 100.0))
    lost = lost_work_s(tmp_path, 1, start_time=100.0, checkpoint=(10, 112.5), now=114.2)
    assert lost == pytest.approx(114.2 - 110.0)  # steps 11..14 and 0.2 s of step 15


def test_records_a_job_made_up_never_fail_the_loop_nor_exceed_the_wall_time(tmp_path):
    # issue 34: `"time": "x"` raised in every reconcile pass; 1e308 was a lost work of 1e308 GPU-s
    bad = [{"step": 14, "time": "x", "attempt": 1}, {"step": "x", "time": 114.0, "attempt": 1},
           {"step": True, "time": 114.0, "attempt": 1}, {"step": 15, "time": float("nan"), "attempt": 1}]
    write(tmp_path, [*steps(1, 1, 13, 100.0), *bad])
    assert lost_work_s(tmp_path, 1, start_time=100.0, checkpoint=(10, 110.5), now=160.0) == pytest.approx(4.0)
    write(tmp_path, [*steps(1, 1, 13, 100.0), {"step": 14, "time": 1e308, "attempt": 1, "step_time_s": 1e308}])
    assert lost_work_s(tmp_path, 1, start_time=100.0, checkpoint=(10, 110.5), now=160.0) == pytest.approx(4.0)
    write(tmp_path, [*steps(1, 1, 13, 100.0), {"step": 14, "time": 5e10, "attempt": 1}])  # in the far future
    assert lost_work_s(tmp_path, 1, start_time=100.0, checkpoint=(10, 110.5), now=160.0) == pytest.approx(50.0)
