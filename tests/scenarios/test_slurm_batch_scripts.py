"""Published Slurm batch scripts through a real `yard up --backend slurm` on the 2-node test
cluster (tests/slurm_cluster.py), submitted with `yard submit job.sbatch` as a user would: the
script runs once, in Slurm's batch step on the first node, Slurm's own `srun` starts the tasks,
the script's exit is the job's, and the preemption notice reaches the tasks, whose 75 through
srun and the script requeues the job (tests/scenarios/test_batch_scripts.py on the local backend).

The multi-node torchrun script of that file is not here: it rendezvous on the name
`scontrol show hostnames` gives (n1), which the test cluster's nodes (all 127.0.0.1, see
tests/slurm_cluster.py) cannot resolve.
"""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.yard_cluster import YardCluster

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm-batch-scenarios")]


@pytest.fixture(scope="module")
def yc(tmp_path_factory):
    c = YardCluster(tmp_path_factory.mktemp("yard-slurm-batch"), "slurm")
    yield c
    c.stop()


def sbatch(yc: YardCluster, path: Path, text: str) -> int:
    path.write_text(text)
    return yc.submit("-D", str(path.parent), str(path))


def batch_log(yc: YardCluster, job: int) -> str:
    return (yc.job_dir(job) / "logs" / "rank-0.log").read_text()


def test_srun_python_prints_each_tasks_procid_and_the_script_exit_is_the_jobs(yc, tmp_path):
    job = sbatch(yc, tmp_path / "procid.sbatch", textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH -N 2 --ntasks-per-node=2 --gres=gpu:2 -A vision
        echo start >> {tmp_path}/count
        head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
        echo "batch on $SLURMD_NODENAME: head $head, $SLURM_NNODES nodes, tasks $SLURM_TASKS_PER_NODE"
        srun {sys.executable} -c 'import os; print("procid", os.environ["SLURM_PROCID"], "local",
            os.environ["SLURM_LOCALID"], "of", os.environ["SLURM_NTASKS"], os.environ["CUDA_VISIBLE_DEVICES"])'
        exit 3
        """))
    j = yc.wait(job, lambda j: j["state"] in ("COMPLETED", "FAILED"), timeout=180)
    out = batch_log(yc, job)
    assert j["state"] == "FAILED" and "3" in j["reason"], (j["reason"], out[-2000:])
    assert (tmp_path / "count").read_text() == "start\n"  # once, not once per task
    assert "batch on n1: head n1, 2 nodes, tasks 2(x2)" in out
    got = sorted(line for line in out.splitlines() if line.startswith("procid"))
    assert got == [f"procid {r} local {r % 2} of 4 0,1" for r in range(4)]
    yc.wait_slurm_empty()


def test_a_batch_job_requeued_by_the_notice_exits_75_through_srun_and_runs_again(yc, tmp_path):
    (tmp_path / "task.py").write_text(textwrap.dedent(f"""\
        import os, signal, sys, time
        rank, attempt = os.environ["SLURM_PROCID"], os.environ["TRAINYARD_ATTEMPT"]
        if attempt != "1":
            sys.exit(0)
        def notice(*_):
            open(f"{tmp_path}/noticed-{{rank}}", "w").close()
            sys.exit(75)  # "checkpointed; requeue me"
        signal.signal(signal.SIGUSR1, notice)
        open(f"{tmp_path}/up-{{rank}}", "w").close()
        while True:
            time.sleep(0.1)
        """))
    job = sbatch(yc, tmp_path / "requeue.sbatch", textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH -N 2 --ntasks-per-node=1 --gpus-per-node=1 -A vision
        echo attempt $TRAINYARD_ATTEMPT >> {tmp_path}/attempts
        srun {sys.executable} task.py
        """))
    yc.wait(job, "RUNNING", timeout=120)
    up = [tmp_path / "up-0", tmp_path / "up-1"]
    end = time.monotonic() + 120
    while not all(p.exists() for p in up):
        assert time.monotonic() < end, batch_log(yc, job)[-2000:]
        time.sleep(0.1)
    yc.yard("requeue", str(job))
    j = yc.wait(job, "COMPLETED", timeout=180)
    assert [a["state"] for a in j["attempts"]] == ["REQUEUED", "COMPLETED"], j["attempts"]
    assert (tmp_path / "noticed-0").exists() and (tmp_path / "noticed-1").exists()  # the notice reached both tasks
    assert (tmp_path / "attempts").read_text() == "attempt 1\nattempt 2\n"
    yc.wait_slurm_empty()
