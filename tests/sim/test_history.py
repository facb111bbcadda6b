"""The trainyard trace (`sim/history.py`): records checked field by field, the run time a job
needed, the workload a configuration replays, and `yard sim --format trainyard`'s bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.sim.recorded_day import THREE_TEAMS
from trainyard.sim.history import check_record, read_history, replay, true_run_s, workload_from, write_history
from trainyard.spec.models import ConfigError, load_config


def rec(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": 1, "name": "train", "user": "alice", "team": "team-a", "class": "training", "pool": "default",
        "submit_time": 1_700_000_000.0, "gpus": 2, "gpus_per_node": None, "nodes_min": 1, "nodes_max": 1,
        "gpu_mem_mib": None, "time_limit_s": 7200.0, "checkpoint_interval_s": 900.0, "run_time_s": 3600.0,
        "run_time_known": True, "attempts": 1, "preemptions": 0, "lost_gpu_s": 0.0, "state": "COMPLETED"}
    return {**base, **kw}


def test_the_run_time_is_the_gpu_time_held_less_the_lost_work_at_full_size() -> None:
    # Two attempts of a 2-node elastic job (8 GPUs at most): 1 h on 4 GPUs, then 1 h on 8, 2 GPU-h lost.
    assert true_run_s([(0.0, 3600.0, 4), (5000.0, 8600.0, 8)], 2 * 3600.0, 8) == pytest.approx(3600.0 * 10 / 8)
    assert true_run_s([(0.0, 100.0, 1)], 500.0, 1) == 0.0  # never below zero
    assert true_run_s([], 0.0, 0) == 0.0


@pytest.mark.parametrize("change, field", [
    ({"gpus": "2"}, "gpus"), ({"run_time_known": 1}, "run_time_known"), ({"gpus": True}, "gpus"),
    ({"submit_time": float("nan")}, "submit_time"), ({"team": None}, "team"), ({"nodes_min": 0}, "nodes_min"),
    ({"nodes_max": 1, "nodes_min": 2}, "nodes_max"), ({"run_time_s": -1.0}, "run_time_s"),
    ({"gpus_per_node": 0}, "gpus_per_node"), ({"gpus": 0}, "gpus"),
])
def test_a_bad_record_names_its_field_and_line(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        check_record(rec(**change), "t.jsonl:3")
    assert e.value.field == field and "t.jsonl:3" in str(e.value)
    missing = rec()
    del missing["lost_gpu_s"]
    with pytest.raises(ConfigError, match="missing field 'lost_gpu_s'"):
        check_record(missing, "t.jsonl:1")


def test_a_trace_file_reads_back_as_written_and_its_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    records = [rec(id=1), rec(id=2, gpus_per_node=4, nodes_min=1, nodes_max=2, time_limit_s=None)]
    path.write_text(write_history(records) + "\n")
    assert read_history(path) == records
    path.write_text(write_history(records) + "{not json\n")
    with pytest.raises(ConfigError, match=r"t.jsonl:3: not JSON"):
        read_history(path)
    path.write_text(write_history([rec(id=1), rec(id=1)]))
    with pytest.raises(ConfigError, match=r"t.jsonl:2: job id 1 appears twice"):
        read_history(path)
    with pytest.raises(ConfigError, match="No such file"):
        read_history(tmp_path / "none.jsonl")


def test_the_workload_is_the_configurations_cluster_with_the_recorded_jobs() -> None:
    spec = load_config(THREE_TEAMS)
    records = [rec(id=7, submit_time=1000.0 + 60, gpus_per_node=8, nodes_min=1, nodes_max=2, run_time_s=10.0),
               rec(id=3, submit_time=1000.0, time_limit_s=None),
               rec(id=9, team="gone", submit_time=2000.0), rec(id=10, **{"class": "nope"})]
    w = workload_from(records, spec)
    assert [j.req.id for j in w.jobs] == [3, 7]
    assert [j.req.submit_time for j in w.jobs] == [0.0, 60.0]  # from the first recorded submission
    gang = w.jobs[1].req
    assert (gang.min_gpus, gang.max_gpus, gang.est_runtime_s, w.jobs[1].duration_s) == (8, 16, 7200.0, 10.0)
    assert w.jobs[0].req.est_runtime_s is None
    assert w.total_gpus == 16 and set(w.teams) == {"team-a", "team-b", "team-c"}
    assert "1 jobs left out: the configuration has no team 'gone'" in w.notes
    assert "1 jobs left out: the configuration has no class 'nope'" in w.notes
    assert all(w.measured(j.req.submit_time) for j in w.jobs)


def test_a_replay_of_two_jobs_gives_their_waits_per_team() -> None:
    # Two 16-GPU jobs at once on 16 GPUs: one waits for the other's hour.
    out = replay([rec(id=1, gpus=16, submit_time=0.0), rec(id=2, gpus=16, submit_time=0.0, team="team-b")],
                 load_config(THREE_TEAMS))
    waits = sorted(out["teams"][t]["mean_wait_s"] for t in ("team-a", "team-b"))
    assert waits == [0.0, 3600.0] and out["metrics"]["completed"] == 2
    assert out["teams"]["team-c"]["jobs"] == 0 and out["policy"] == "trainyard"
    assert out["teams"]["team-a"]["busy_gpu_hours"] + out["teams"]["team-b"]["busy_gpu_hours"] == pytest.approx(32.0)


YARD = [sys.executable, "-m", "trainyard.cli.main"]


def yard(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([*YARD, *map(str, args)], capture_output=True, text=True, timeout=120, env=dict(os.environ))


def test_yard_sim_format_trainyard_refuses_bad_input_with_exit_2(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(write_history([rec()]) + json.dumps(rec(id=2, gpus=-1)) + "\n")
    out = tmp_path / "out"
    r = yard("sim", "--format", "trainyard", "--trace", trace, "--config", THREE_TEAMS, "--out", out)
    assert r.returncode == 2 and "t.jsonl:2" in r.stderr and "'gpus'" in r.stderr
    r = yard("sim", "--format", "trainyard", "--trace", trace, "--out", out)
    assert r.returncode == 2 and "--config" in r.stderr
    r = yard("sim", "--format", "trainyard", "--trace", trace, "--config", THREE_TEAMS, "--cluster", "2x8", "--out", out)
    assert r.returncode == 2 and "--cluster" in r.stderr
    assert not out.exists()
