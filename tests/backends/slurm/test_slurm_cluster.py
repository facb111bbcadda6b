"""The Slurm test harness (tests/slurm_cluster.py) against a real slurmctld and two slurmd on this machine.

Skipped, with the reason, where Slurm cannot be installed (scripts/slurm-setup.sh) or we are not root.
"""

from __future__ import annotations

import os
import re
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm_cluster import SlurmCluster, slurm_available

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm-cluster")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = slurm_available()
    if reason:
        pytest.skip(reason)
    c = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def idle(cluster: SlurmCluster) -> SlurmCluster:
    """The cluster with both nodes idle and no job left (a failed test must not spoil the next)."""
    cluster.run("scancel", "--full", "--partition=main", check=False)
    for n in cluster.nodes:
        if not cluster.slurmd_running(n):
            cluster.start_slurmd(n)
    cluster.wait_for(lambda: not cluster.run("squeue", "-h").stdout.strip(), 30, "an empty queue")
    cluster.wait_nodes("IDLE", timeout=30)
    return cluster


def write_script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def wait_files(paths: list[Path], cluster: SlurmCluster, timeout: float = 20) -> None:
    cluster.wait_for(lambda: all(p.exists() for p in paths), timeout, lambda: f"{[str(p) for p in paths if not p.exists()]}")


def test_two_nodes_with_four_gpus_each(idle: SlurmCluster) -> None:
    out = idle.run("sinfo", "-h", "-N", "-o", "%N %T %G %P").stdout
    assert sorted(out.split("\n")[:-1]) == ["n1 idle gpu:4 main*", "n2 idle gpu:4 main*"]
    for n in ("n1", "n2"):
        node = idle.run("scontrol", "show", "node", n).stdout
        assert "Gres=gpu:4" in node
        assert "State=IDLE" in node
        assert f"Port={idle.slurmd_ports[n]}" in node
    # the emulated GPUs are device files Slurm accepts (a character device, like /dev/null)
    for files in idle.gres_files.values():
        assert len(files) == 4 and all(f.exists() for f in files)


def test_two_node_job_runs_four_tasks_per_node(idle: SlurmCluster, tmp_path: Path) -> None:
    script = write_script(
        tmp_path / "job.sh",
        """\
        echo "batch $SLURMD_NODENAME gpus=$SLURM_JOB_GPUS"
        srun bash -c 'echo "task $SLURMD_NODENAME $SLURM_PROCID $SLURM_LOCALID $SLURM_STEP_GPUS"'
        srun --gpus-per-task=1 bash -c 'echo "gpu $SLURMD_NODENAME $SLURM_PROCID $CUDA_VISIBLE_DEVICES"'
        """,
    )
    out = tmp_path / "job.out"
    job = idle.sbatch(
        "--nodes=2", "--nodelist=n1,n2", "--ntasks-per-node=4", "--gres=gpu:4", "-o", str(out), str(script)
    )
    info = idle.wait_job(job, timeout=60)
    text = out.read_text()
    assert info["JobState"] == "COMPLETED", text
    assert info["NodeList"] == "n[1-2]"

    assert "batch n1 gpus=0,1,2,3" in text
    tasks = [line.split() for line in text.splitlines() if line.startswith("task ")]
    assert sorted(int(t[2]) for t in tasks) == list(range(8)), text
    by_node = {n: sorted(int(t[3]) for t in tasks if t[1] == n) for n in ("n1", "n2")}
    assert by_node == {"n1": [0, 1, 2, 3], "n2": [0, 1, 2, 3]}, text
    assert {t[4] for t in tasks} == {"0,1,2,3"}  # a step without --gpus-per-task sees all the node's GPUs
    # srun --gpus-per-task=1 binds one emulated GPU per task
    gpus = [line.split() for line in text.splitlines() if line.startswith("gpu ")]
    assert {n: sorted(g[3] for g in gpus if g[1] == n) for n in ("n1", "n2")} == {
        "n1": ["0", "1", "2", "3"],
        "n2": ["0", "1", "2", "3"],
    }, text

    # no slurmdbd: plain sacct is off, but `sacct --completion` reads the jobcomp/filetxt log
    acct = idle.run("sacct", "-c", "-j", str(job), "-n", "-P", "-o", "JobID,State,ExitCode,NodeList").stdout
    assert acct.split() == [f"{job}|COMPLETED|0:0|n[1-2]"]


def test_scancel_signal_reaches_tasks_and_batch_shell(idle: SlurmCluster, tmp_path: Path) -> None:
    d = tmp_path
    script = write_script(
        d / "sig.sh",
        f"""\
        trap 'touch {d}/batch.usr1' USR1
        srun bash -c 'trap "touch {d}/usr1.$SLURM_PROCID" USR1; touch {d}/up.$SLURM_PROCID
                      while :; do sleep 0.1 & wait $!; done' &
        while :; do wait; done
        """,
    )
    job = idle.sbatch("--nodes=2", "--ntasks-per-node=4", "--gres=gpu:4", "-o", str(d / "sig.out"), str(script))
    wait_files([d / f"up.{i}" for i in range(8)], idle, 30)

    # plain --signal: every task of every step, not the batch shell
    idle.run("scancel", "--signal=USR1", str(job))
    wait_files([d / f"usr1.{i}" for i in range(8)], idle)
    time.sleep(0.5)
    assert not (d / "batch.usr1").exists()

    # --batch: the batch shell only
    for i in range(8):
        (d / f"usr1.{i}").unlink()
    idle.run("scancel", "--signal=USR1", "--batch", str(job))
    wait_files([d / "batch.usr1"], idle)
    time.sleep(0.5)
    assert not any((d / f"usr1.{i}").exists() for i in range(8))

    # --full: the batch shell, its children (srun) and the steps' tasks
    (d / "batch.usr1").unlink()
    idle.run("scancel", "--signal=USR1", "--full", str(job))
    wait_files([d / "batch.usr1", *(d / f"usr1.{i}" for i in range(8))], idle)

    assert idle.job_info(job)["JobState"] == "RUNNING"
    idle.run("scancel", str(job))
    assert idle.wait_job(job, timeout=30)["JobState"] == "CANCELLED"


def test_requeue_reruns_the_batch_script(idle: SlurmCluster, tmp_path: Path) -> None:
    script = write_script(tmp_path / "rq.sh", "echo run ${SLURM_RESTART_COUNT:-0}\nexec sleep 300\n")
    out = tmp_path / "rq.out"
    job = idle.sbatch("--nodes=1", "--open-mode=append", "-o", str(out), str(script))
    idle.wait_for(lambda: out.exists() and "run 0" in out.read_text(), 30, "first run")
    idle.run("scontrol", "requeue", str(job))
    # back to PENDING (Reason=BeginTime for cred_expire s), then it runs again as restart 1
    idle.wait_for(lambda: "run 1" in out.read_text(), 40, lambda: f"second run, job {idle.job_info(job)}")
    assert idle.job_info(job)["Restarts"] == "1"
    text = out.read_text()
    assert [line for line in text.splitlines() if line.startswith("run ")] == ["run 0", "run 1"]
    assert f"JOB {job} ON n1 CANCELLED AT" in text and "DUE TO JOB REQUEUE" in text
    idle.run("scancel", str(job))
    idle.wait_job(job, timeout=30)


def test_node_goes_down_without_its_slurmd_and_returns(idle: SlurmCluster) -> None:
    idle.kill_slurmd("n2")
    t0 = time.monotonic()
    idle.wait_nodes("DOWN", ["n2"], timeout=45)  # SlurmdTimeout=10, MessageTimeout=5: ~20 s
    assert time.monotonic() - t0 < 45
    assert idle.node_state("n2") == "DOWN+NOT_RESPONDING"
    assert idle.node_state("n1") == "IDLE"
    assert re.fullmatch(r"down\*", idle.run("sinfo", "-h", "-n", "n2", "-o", "%t").stdout.strip())

    idle.start_slurmd("n2")  # ReturnToService=2: it comes back by itself
    idle.wait_nodes("IDLE", ["n2"], timeout=30)


def test_stop_leaves_no_process_behind(tmp_path: Path) -> None:
    reason = slurm_available()
    if reason:
        pytest.skip(reason)
    mark = f"TY_SLURM_LEFTOVER={tmp_path}"
    c = SlurmCluster(tmp_path / "c", nodes=("a1", "a2"), gpus_per_node=2)
    c.start()
    try:
        job = c.sbatch(f"--export=ALL,{mark}", "--nodes=2", "--wrap", "srun sleep 300")
        c.wait_for(lambda: c.run("squeue", "-h", "-s", "-j", str(job)).stdout.count(f"{job}.0"), 30, "step 0")
        c.wait_for(lambda: len(marked(mark)) >= 2, 10, "the two sleeps")
        pids = list(c.pids().values())
        assert len(pids) == 4
    finally:
        c.stop()
    assert marked(mark) == []
    assert [p for p in pids if alive(p)] == []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def marked(mark: str) -> list[int]:
    needle = mark.encode() + b"\0"
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    if needle in f.read() and alive(int(d)):
                        out.append(int(d))
            except OSError:
                pass
    return out
