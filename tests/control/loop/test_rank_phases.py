"""`control/loop/rank_phases.py`: a rank's own work per step from its phase file, read as untrusted
input (a link, a FIFO, a huge file, garbage figures are "no report", never an error or a wait), and
which ranks of a gang straggle."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from trainyard.contracts import PHASES_MAX_BYTES, JobDir
from trainyard.control.loop.rank_phases import own_work, slow_ranks


def phases(jd: JobDir, attempt: int, rank: int, recent: list, **more: object) -> Path:
    path = jd.phases_file(attempt, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"v": 1, "attempt": attempt, "rank": rank, "began": 1.0, "recent": recent, **more}))
    return path


def steady(own_s: float, comm_s: float, steps: range = range(1, 21)) -> list:
    return [[s, own_s + comm_s, comm_s] for s in steps]


def test_own_work_is_step_time_less_comm_time(tmp_path: Path) -> None:
    jd = JobDir(tmp_path / "job")
    phases(jd, 2, 1, [[7, 1.0, 0.25], [8, 0.5], [9, 0.5, None]])
    assert own_work(jd, 2, 1) == {7: 0.75, 8: 0.5, 9: 0.5}  # comm absent or null counts as 0


def test_a_file_of_another_attempt_or_rank_is_no_report(tmp_path: Path) -> None:
    jd = JobDir(tmp_path / "job")
    path = phases(jd, 1, 0, steady(0.1, 0.0))
    path.rename(jd.phases_file(2, 0))  # attempt 1's content under attempt 2's name
    assert own_work(jd, 2, 0) == {}
    assert own_work(jd, 1, 0) == {}  # and nothing at attempt 1's name now


def test_garbage_figures_are_skipped_not_errors(tmp_path: Path) -> None:
    jd = JobDir(tmp_path / "job")
    rows = [[1, "x", 0], [2, float("nan"), 0], [3, 1e308, 0], [True, 1.0, 0], [4, -1.0, 0], [5, 1.0, -2],
            [-1, 1.0, 0], "row", [6], [10**30, 1.0, 0], [7, 1.0, 0.5], [8, 0.2, 0.9]]
    path = jd.phases_file(1, 0)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"v": 1, "attempt": 1, "rank": 0, "began": 1.0, "recent": rows}))
    assert own_work(jd, 1, 0) == {7: 0.5, 8: 0.0}  # comm beyond the step: no negative work
    for doc in ("[1, 2]", '{"attempt": 1, "rank": 0, "recent": "x"}', "not json", '{"attempt": "1", "rank": 0}'):
        path.write_text(doc)
        assert own_work(jd, 1, 0) == {}


def test_a_symlink_in_place_of_the_file_or_its_directory_is_not_followed(tmp_path: Path) -> None:
    jd = JobDir(tmp_path / "job")
    secret = tmp_path / "elsewhere.json"
    secret.write_text(json.dumps({"v": 1, "attempt": 1, "rank": 0, "began": 1.0, "recent": steady(0.1, 0.0)}))
    jd.phases_dir.mkdir(parents=True)
    os.symlink(secret, jd.phases_file(1, 0))
    assert own_work(jd, 1, 0) == {}
    (tmp_path / "real").mkdir()
    os.replace(secret, tmp_path / "real" / jd.phases_file(1, 0).name)
    os.unlink(jd.phases_file(1, 0))
    os.rmdir(jd.phases_dir)
    os.symlink(tmp_path / "real", jd.phases_dir)  # the directory a link
    assert own_work(jd, 1, 0) == {}


def test_a_fifo_in_place_of_the_file_is_not_waited_on(tmp_path: Path) -> None:
    jd = JobDir(tmp_path / "job")
    jd.phases_dir.mkdir(parents=True)
    os.mkfifo(jd.phases_file(1, 0))
    out: list = []
    t = threading.Thread(target=lambda: out.append(own_work(jd, 1, 0)), daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(5)
    assert not t.is_alive() and out == [{}], "the read waited on a FIFO"
    assert time.monotonic() - t0 < 5


def test_a_file_over_the_bound_is_not_read(tmp_path: Path) -> None:
    jd = JobDir(tmp_path / "job")
    path = phases(jd, 1, 0, steady(0.1, 0.0), pad="x" * PHASES_MAX_BYTES)
    assert path.stat().st_size > PHASES_MAX_BYTES
    assert own_work(jd, 1, 0) == {}
    phases(jd, 1, 0, steady(0.1, 0.0))
    assert len(own_work(jd, 1, 0)) == 20


def test_a_rank_four_times_slower_than_its_one_peer_is_flagged_with_both_medians() -> None:
    # synchronous data parallelism: equal step times, the fast rank waits in the all-reduce
    own = {0: {s: 0.1 for s in range(1, 21)}, 1: {s: 0.4 for s in range(1, 21)}}
    flags, judged = slow_ranks(own, window=10, factor=1.5)
    assert judged and [f.rank for f in flags] == [1]
    assert flags[0].median_s == 0.4 and flags[0].gang_s == 0.1 and flags[0].steps == (11, 20)


def test_a_window_judges_only_the_steps_every_rank_reported_and_a_noisy_step_does_not_flag() -> None:
    fast = {s: 0.1 for s in range(1, 31)}
    noisy = {**fast, 25: 5.0, 26: 5.0}  # two bad steps of ten: the median holds
    own = {0: fast, 1: dict(fast), 2: noisy, 3: {s: 0.1 for s in range(1, 28)}}  # rank 3 is 3 steps behind
    flags, judged = slow_ranks(own, window=10, factor=1.5)
    assert judged and flags == []
    own[3] = {s: 0.1 for s in range(1, 9)}  # too few common steps: nobody judged
    assert slow_ranks(own, window=10, factor=1.5) == ([], False)
    assert slow_ranks({0: fast}, window=10, factor=1.5) == ([], False)  # one rank: no gang


def test_in_a_larger_gang_only_the_slow_rank_is_flagged_and_the_factor_is_a_bound() -> None:
    own = {r: {s: 0.1 for s in range(10)} for r in range(8)}
    own[5] = {s: 0.16 for s in range(10)}
    assert [f.rank for f in slow_ranks(own, 10, 1.5)[0]] == [5]
    assert slow_ranks(own, 10, 1.7)[0] == []  # 1.6 times is not 1.7 times
    same = {r: {s: 0.0 for s in range(10)} for r in range(2)}  # no comm measured: everyone alike
    assert slow_ranks(same, 10, 1.5) == ([], True)


def test_a_file_nested_too_deep_to_decode_is_no_report(tmp_path: Path) -> None:
    jd = JobDir(tmp_path / "job")
    path = jd.phases_file(1, 0)
    path.parent.mkdir(parents=True)
    path.write_text('{"attempt": 1, "rank": 0, "recent": ' + "[" * 30_000 + "]" * 30_000 + "}")  # < PHASES_MAX_BYTES
    assert path.stat().st_size <= PHASES_MAX_BYTES
    assert own_work(jd, 1, 0) == {}
