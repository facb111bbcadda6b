"""Published Slurm batch scripts through a real `yard up` on the local backend, submitted with
`yard submit job.sbatch` as a user would: the script runs once on the first node, its `srun`
starts the tasks, `scontrol show hostnames` gives the rendezvous host, and the script's exit is
the job's (also a requeue on the preemption notice).

Name resolution: the local backend plays every node on this machine, and a script that
rendezvous on `$head` needs that name to resolve. The cluster here names its first node
`localhost` (the head, where the batch script and the rendezvous run; every machine resolves it to
127.0.0.1) and its second `node-1`, which no task has to resolve. An operator emulating a cluster
with other names adds them to /etc/hosts (`127.0.0.1 node-0 node-1`).
"""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.yard_cluster import YardCluster
from trainyard.ports import free_port

pytestmark = pytest.mark.slow

CONFIG = textwrap.dedent("""\
    cluster:
      name: test
      nodes:
        - {name: localhost, gpus: 2, gpu_model: emulated, gpu_mem_gb: 16, block: b0, rack: r0}
        - {name: node-1, gpus: 2, gpu_model: emulated, gpu_mem_gb: 16, block: b0, rack: r0}
    teams:
      - name: vision
        quotas:
          default: {nominal: 4, borrowing_limit: 0}
    classes:
      - {name: training, priority: 200, preemptible: true, max_wait: 24h, min_run_time: 0, grace_period: 20}
    default_class: training
    """)
ALLREDUCE = textwrap.dedent("""\
    import os
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item()} procid {os.environ['SLURM_PROCID']}"
          f" node {os.environ['SLURMD_NODENAME']}", flush=True)
    dist.destroy_process_group()
    """)


@pytest.fixture(scope="module")
def yc(tmp_path_factory):
    work = tmp_path_factory.mktemp("batch")
    config = work / "cluster.yaml"
    config.write_text(CONFIG)
    c = YardCluster(work / "cluster", "local", config_file=config)
    yield c
    c.stop()


def sbatch(yc: YardCluster, path: Path, text: str) -> int:
    path.write_text(text)
    return yc.submit("-D", str(path.parent), str(path))


def batch_log(yc: YardCluster, job: int) -> str:
    return (yc.job_dir(job) / "logs" / "rank-0.log").read_text()


def test_a_multi_node_torchrun_script_as_published(yc, tmp_path):
    (tmp_path / "allreduce.py").write_text(ALLREDUCE)
    port = free_port("127.0.0.1")
    job = sbatch(yc, tmp_path / "ddp.sbatch", textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH -N 2 --ntasks-per-node=1 --gpus-per-node=2
        #SBATCH -A vision -J ddp --time=10:00
        head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
        echo "batch on $SLURMD_NODENAME: head $head, $SLURM_NNODES nodes, tasks $SLURM_TASKS_PER_NODE"
        echo ran >> {tmp_path}/ran
        srun {sys.executable} -m torch.distributed.run --nnodes $SLURM_NNODES --nproc_per_node 1 \\
            --rdzv_id $SLURM_JOB_ID --rdzv_backend c10d --rdzv_endpoint $head:{port} allreduce.py
        """))
    j = yc.wait(job, lambda j: j["state"] in ("COMPLETED", "FAILED"), timeout=240)
    out = batch_log(yc, job)
    assert j["state"] == "COMPLETED", out[-3000:]
    assert "batch on localhost: head localhost, 2 nodes, tasks 1(x2)" in out
    assert (tmp_path / "ran").read_text() == "ran\n"  # once, not once per task
    lines = sorted(line for line in out.splitlines() if line.startswith("rank "))
    assert lines == ["rank 0 of 2 sum 3.0 procid 0 node localhost", "rank 1 of 2 sum 3.0 procid 1 node node-1"] or \
        lines == ["rank 0 of 2 sum 3.0 procid 1 node node-1", "rank 1 of 2 sum 3.0 procid 0 node localhost"]


def test_srun_python_prints_each_tasks_procid_and_the_script_exit_is_the_jobs(yc, tmp_path):
    job = sbatch(yc, tmp_path / "procid.sbatch", textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH -N 2 --ntasks-per-node=2 --gres=gpu:2 -A vision
        echo start >> {tmp_path}/count
        srun {sys.executable} -c 'import os; print("procid", os.environ["SLURM_PROCID"], "local",
            os.environ["SLURM_LOCALID"], "of", os.environ["SLURM_NTASKS"], os.environ["CUDA_VISIBLE_DEVICES"])'
        exit 3
        """))
    j = yc.wait(job, lambda j: j["state"] in ("COMPLETED", "FAILED"), timeout=120)
    assert j["state"] == "FAILED" and "3" in j["reason"], j["reason"]
    assert (tmp_path / "count").read_text() == "start\n"
    got = sorted(line for line in batch_log(yc, job).splitlines() if line.startswith("procid"))
    assert got == [f"procid {r} local {r % 2} of 4 0,1" for r in range(4)]
    shown = yc.yard("logs", str(job), "--rank", "3").stdout
    assert "procid 3 local 1 of 4" in shown  # task 3's own log


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
        echo attempt $TRAINYARD_ATTEMPT restart ${{SLURM_RESTART_COUNT:-none}} >> {tmp_path}/attempts
        srun {sys.executable} task.py
        """))
    yc.wait(job, "RUNNING", timeout=60)
    up = [tmp_path / "up-0", tmp_path / "up-1"]
    end = time.monotonic() + 60
    while not all(p.exists() for p in up):
        assert time.monotonic() < end, batch_log(yc, job)[-2000:]
        time.sleep(0.1)
    yc.yard("requeue", str(job))
    j = yc.wait(job, "COMPLETED", timeout=120)
    assert [a["state"] for a in j["attempts"]] == ["REQUEUED", "COMPLETED"], j["attempts"]
    assert (tmp_path / "noticed-0").exists() and (tmp_path / "noticed-1").exists()  # the notice reached both tasks
    assert (tmp_path / "attempts").read_text() == "attempt 1 restart none\nattempt 2 restart 1\n"
