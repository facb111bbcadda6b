"""`services/whatif.py`: the store's jobs as the trainyard trace (a real SQLite store), and the two
replays side by side in a child process giving what they give one after the other."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sim.recorded_day import THREE_TEAMS
from tests.sim.test_history import rec
from trainyard.services import whatif
from trainyard.services.accounting import Window
from trainyard.store.db import open_store, sqlite_url
from trainyard.store.models import AttemptRow, JobRow

NOW = 1_800_000_000.0


def job(i: int, state: str, submit: float, **kw: object) -> JobRow:
    return JobRow(id=i, name=f"j{i}", user="bob", team="team-b", job_class="batch", pool="default", state=state,
                  command=["true"], workdir="/tmp", gpus=2, submit_time=submit, queued_since=submit,
                  time_limit_s=3600.0, **kw)


def test_the_trace_of_the_store_says_what_each_job_needed(tmp_path: Path) -> None:
    store = open_store(sqlite_url(tmp_path))
    with store.session() as s:
        s.add_all([job(1, "COMPLETED", NOW - 5000, lost_gpu_s=200.0, eligible_time=NOW - 4900),
                   job(2, "RUNNING", NOW - 4000),
                   job(3, "PENDING", NOW - 3000),  # never started: not in the trace
                   job(4, "CANCELLED", NOW - 2000),  # cancelled while waiting: neither
                   job(5, "COMPLETED", NOW - 90_000),  # before the window
                   job(6, "TIMEOUT", NOW - 1000, gpus_per_node=2, nodes_min=1, nodes_max=2)])
        s.flush()
        s.add_all([AttemptRow(job_id=1, attempt=0, placement=[], started_at=NOW - 4800, ended_at=NOW - 4000,
                              state="PREEMPTED", cause="preempted", gpus=2),
                   AttemptRow(job_id=1, attempt=1, placement=[], started_at=NOW - 3900, ended_at=NOW - 3000,
                              state="COMPLETED", cause="completed", gpus=0),  # a row of before the gpus column
                   AttemptRow(job_id=2, attempt=0, placement=[], started_at=NOW - 1000, ended_at=None,
                              state="RUNNING", gpus=2),
                   AttemptRow(job_id=5, attempt=0, placement=[], started_at=NOW - 89_000, ended_at=NOW - 88_000,
                              state="COMPLETED", cause="completed", gpus=2),
                   AttemptRow(job_id=6, attempt=0, placement=[], started_at=NOW - 900, ended_at=NOW - 500,
                              state="TIMEOUT", cause="timeout", gpus=2)])
        s.commit()
        records = whatif.history_records(s, Window(NOW - 86_400, NOW), NOW)
    store.close()
    by_id = {r["id"]: r for r in records}
    assert list(by_id) == [1, 2, 6]
    one = by_id[1]
    assert one["submit_time"] == NOW - 4900  # its eligible time, as the engine reads it
    assert one["run_time_s"] == pytest.approx((800 * 2 + 900 * 2 - 200) / 2)
    assert (one["attempts"], one["preemptions"], one["run_time_known"], one["lost_gpu_s"]) == (2, 1, True, 200.0)
    assert by_id[2]["run_time_s"] == 1000.0 and by_id[2]["run_time_known"] is False  # running: so far
    assert by_id[6]["run_time_s"] == pytest.approx(400 * 2 / 4)  # at its largest size, 2 nodes x 2
    assert by_id[6]["state"] == "TIMEOUT" and by_id[6]["nodes_max"] == 2


def test_the_replays_side_by_side_give_what_they_give_one_after_the_other(monkeypatch: pytest.MonkeyPatch) -> None:
    records = [rec(id=i, submit_time=60.0 * i, gpus=1 + i % 8, team=("team-a", "team-b")[i % 2]) for i in range(40)]
    text = THREE_TEAMS.read_text()
    half = text.replace("{nominal: 8}", "{nominal: 4}")
    monkeypatch.setattr(whatif, "PARALLEL_FROM_JOBS", 0)
    side = whatif.replay_both(records, (text, "a"), (half, "b"))
    monkeypatch.setattr(whatif, "PARALLEL_FROM_JOBS", 10**9)
    one = whatif.replay_both(records, (text, "a"), (half, "b"))
    for x, y in zip(side, one):
        x["metrics"].pop("sim_wall_s")
        y["metrics"].pop("sim_wall_s")
    assert side == one and side[0] != side[1]
