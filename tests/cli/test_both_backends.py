"""One CLI suite, run against both backends: `yard submit`, `queue`, `nodes`, `show`, `logs` and
`cancel` behave the same on the local backend's emulated nodes and on the real Slurm test cluster
(tests/slurm_cluster.py; skipped with the reason where Slurm cannot be installed)."""

from __future__ import annotations

import json
import sys
import time

import pytest

from tests.yard_cluster import YardCluster

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("both-backends")]

SLEEPER = [sys.executable, "-c", "import os, time; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], "
           "'on', os.environ['TRAINYARD_NODE'], flush=True); time.sleep(120)"]
QUICK = [sys.executable, "-c", "import os; print('hello from rank', os.environ['RANK'], flush=True)"]


@pytest.fixture(scope="module", params=["local", pytest.param("slurm", marks=pytest.mark.slurm)])
def yc(request, tmp_path_factory):
    c = YardCluster(tmp_path_factory.mktemp(f"cli-{request.param}"), request.param)
    yield c
    c.stop()


def test_nodes_lists_the_backends_nodes_up_with_their_gpus(yc):
    nodes = json.loads(yc.yard("nodes", "--json").stdout)
    assert sorted(n["name"] for n in nodes) == yc.nodes
    assert all(n["state"] == "up" and n["gpus"] == 4 for n in nodes), nodes
    # how each attempt's processes are contained: the local backend's cell, or Slurm's own steps
    want = {"slurm"} if yc.backend == "slurm" else {"cgroup2", "cgroup1", "subreaper"}
    assert {n["containment"] for n in nodes} <= want and len({n["containment"] for n in nodes}) == 1
    table = yc.yard("nodes").stdout
    assert all(name in table for name in yc.nodes) and "CONTAIN" in table


def test_submit_queue_show_logs_and_cancel(yc):
    job = yc.submit("-N", "2", "--gpus-per-node", "2", "-A", "vision", "--", *SLEEPER)
    j = yc.wait(job, "RUNNING", timeout=60)
    assert sorted(p["node"] for p in j["placement"]) == yc.nodes
    queue = yc.yard("queue").stdout
    assert str(job) in queue and "RUNNING" in queue
    assert json.loads(yc.yard("queue", "--json").stdout)[0]["id"] == job
    show = yc.yard("show", str(job)).stdout
    assert "RUNNING" in show and "vision" in show
    log = ""
    for _ in range(100):
        log = yc.yard("logs", str(job), "--rank", "3").stdout
        if "rank 3 of 4" in log:
            break
        time.sleep(0.1)
    assert "rank 3 of 4" in log, log
    yc.yard("cancel", str(job))
    done = yc.wait(job, "CANCELLED", timeout=60)
    assert done["attempts"][0]["state"] == "CANCELLED"
    yc.wait_slurm_empty()


def test_a_job_that_completes_shows_its_output_and_exit(yc):
    job = yc.submit("-G", "1", "-A", "nlp", "--", *QUICK)
    done = yc.wait(job, "COMPLETED", timeout=60)
    assert done["exit_code"] == 0
    assert "hello from rank 0" in yc.yard("logs", str(job)).stdout


def test_array_tasks_see_their_index_and_a_dependency_waits_for_the_array(yc):
    """Arrays and dependencies are the control plane's: on Slurm too, each task is its own sbatch
    that sees trainyard's SLURM_ARRAY_* values, and the dependent job starts after the last task."""
    array = int(yc.yard("submit", "--parsable", "--array", "3,5", "-G", "1", "-A", "nlp", "--", sys.executable, "-c",
                        "import os; print('task', os.environ['SLURM_ARRAY_TASK_ID'], 'of',"
                        " os.environ['SLURM_ARRAY_JOB_ID'], flush=True)").stdout)
    after = yc.submit("-d", f"afterok:{array}", "-G", "1", "-A", "nlp", "--", *QUICK)
    done = yc.wait(after, "COMPLETED", timeout=90)
    tasks = [t for t in json.loads(yc.yard("queue", "-t", "all", "--json").stdout) if t["array_job_id"] == array]
    assert sorted(t["array_task_id"] for t in tasks) == [3, 5]
    for t in tasks:
        assert t["state"] == "COMPLETED" and t["end_time"] <= done["start_time"]
        assert f"task {t['array_task_id']} of {array}" in yc.yard("logs", f"{array}_{t['array_task_id']}").stdout
    yc.wait_slurm_empty()


def test_bad_input_is_refused_with_exit_2_the_same_way(yc):
    r = yc.yard("submit", "-G", "0", "-A", "vision", "--", *QUICK, check=False)
    assert r.returncode == 2 and "gpus" in r.stderr.lower()
    r = yc.yard("cancel", "999999", check=False)
    assert r.returncode != 0 and "999999" in (r.stderr + r.stdout)
