"""A batch script on the Slurm backend runs as sbatch runs one: once, in Slurm's own batch step on
the first node, with Slurm's `srun` starting the tasks; the script's exit is the attempt's. The
real 2-node test cluster (tests/slurm_cluster.py; skipped with the reason where Slurm cannot be
installed or we are not root), the same cases as tests/backends/local/test_local_batch.py where Slurm
allows them."""

from __future__ import annotations

import shutil
import signal
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.backends.helpers import make_spec, marked_processes, wait_done, wait_until
from tests.slurm_cluster import SlurmCluster, slurm_available
from trainyard.backends.base import LaunchSpec
from trainyard.backends.slurm.backend import SlurmBackend

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm-batch")]

PY = sys.executable
TWO_NODES = ((0, "n1", (0, 1)), (1, "n2", (0, 1)))  # -N 2 --ntasks-per-node=1 --gpus-per-node=2
FOUR_TASKS = ((0, "n1", (0,)), (1, "n1", (1,)), (2, "n2", (0,)), (3, "n2", (1,)))  # -N 2 --ntasks-per-node=2
PATIENCE_S = 120  # sbatch → slurmctld → slurmd → batch step → srun → tasks, on a loaded machine


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = slurm_available()
    if reason:
        pytest.skip(reason)
    c = SlurmCluster(tmp_path_factory.mktemp("slurm-batch"))
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def backend(cluster: SlurmCluster, tmp_path: Path) -> Iterator[SlurmBackend]:
    be = SlurmBackend(tmp_path, env=cluster.env(), launch_timeout_s=PATIENCE_S)
    yield be
    for a in be.poll():
        be.release(a.job_id, a.attempt)
    wait_until(lambda: marked_processes(tmp_path) == [], timeout=60, what="the job's processes gone")


def batch(tmp_path: Path, job_id: int, body: str, ranks=TWO_NODES, **kw) -> LaunchSpec:  # noqa: ANN001
    script = tmp_path / f"job{job_id}.sbatch"
    script.write_text("#!/bin/bash\n" + body)
    spec = make_spec(tmp_path, job_id, ["/bin/bash", str(script)], ranks=ranks, **kw)
    return replace(spec, batch=True)


def log(tmp_path: Path, job_id: int, rank: int = 0) -> str:
    return (tmp_path / "jobs" / str(job_id) / "logs" / f"rank-{rank}.log").read_text()


def test_the_script_runs_once_in_the_batch_step_and_slurms_srun_starts_every_task(backend, tmp_path):
    marker = tmp_path / "ran"
    task = ("import os; print('task', os.environ['SLURM_PROCID'], os.environ['SLURMD_NODENAME'], "
            "os.environ['FROM_THE_JOB'], os.environ['TRAINYARD_JOB_ID'], os.environ['MASTER_PORT'])")
    body = (f"echo once >> {marker}\n"
            'echo "step $SLURMD_NODENAME $SLURM_JOB_NUM_NODES $SLURM_NTASKS ${RANK:-no-rank} '
            '${WORLD_SIZE:-no-world} $FROM_THE_JOB $TRAINYARD_JOB_ID $MASTER_PORT"\n'
            'echo "srun=$(command -v srun) scontrol=$(command -v scontrol)"\n'
            f"srun {PY} -c \"{task}\"\n")
    backend.launch(batch(tmp_path, 1, body, ranks=FOUR_TASKS, env={"FROM_THE_JOB": "yes"}))
    state = wait_done(backend, 1, timeout=PATIENCE_S)
    assert [(r.rank, r.exit_code) for r in state.ranks] == [(0, 0)]  # one rank, the script: reconcile wants one
    assert marker.read_text() == "once\n"
    out = log(tmp_path, 1)
    (step,) = [line.split() for line in out.splitlines() if line.startswith("step ")]
    port = step[-1]
    assert step == ["step", "n1", "2", "4", "no-rank", "no-world", "yes", "1", port] and port.isdigit()
    assert f"srun={shutil.which('srun', path='/usr/bin:/bin')}" in out  # Slurm's own
    tasks = sorted(line for line in out.splitlines() if line.startswith("task "))
    assert tasks == [f"task {r} {'n1' if r < 2 else 'n2'} yes 1 {port}" for r in range(4)]


def test_the_scripts_exit_is_the_attempts_failure(backend, tmp_path):
    backend.launch(batch(tmp_path, 2, f"srun {PY} -c pass\necho srun said $?\nexit 3\n"))
    assert wait_done(backend, 2, timeout=PATIENCE_S).ranks[0].exit_code == 3
    assert "srun said 0" in log(tmp_path, 2)


def test_a_requeue_exit_of_the_script_reads_as_75(backend, tmp_path):
    backend.launch(batch(tmp_path, 3, f"srun {PY} -c 'raise SystemExit(75)'\n"))
    assert wait_done(backend, 3, timeout=PATIENCE_S).ranks[0].exit_code == 75


def test_the_preemption_notice_reaches_the_sruns_tasks_and_their_75_is_the_scripts(backend, tmp_path):
    task = ("import os, signal, sys, time, pathlib; "
            "signal.signal(signal.SIGUSR1, lambda *_: sys.exit(75)); "
            f"pathlib.Path('{tmp_path}', 'up-' + os.environ['SLURM_PROCID']).touch(); time.sleep(300)")
    body = f'srun {PY} -c "{task}"\nrc=$?\necho "srun said $rc"\nexit $rc\n'
    backend.launch(batch(tmp_path, 4, body))
    wait_until(lambda: (tmp_path / "up-0").exists() and (tmp_path / "up-1").exists(), PATIENCE_S, "both tasks up")
    backend.signal(4, 1, signal.SIGUSR1)
    assert wait_done(backend, 4, timeout=PATIENCE_S).ranks[0].exit_code == 75
    assert "srun said 75" in log(tmp_path, 4)  # the script's shell was not killed by the notice


def test_a_stop_reaches_the_scripts_shell(backend, tmp_path):
    """SIGTERM goes with --full: a script that runs no srun step (a plain `sleep`) stops too."""
    backend.launch(batch(tmp_path, 5, f"touch {tmp_path}/up\nsleep 300\n"))
    wait_until(lambda: (tmp_path / "up").exists(), PATIENCE_S, "the script up")
    backend.signal(5, 1, signal.SIGTERM)
    rank = wait_done(backend, 5, timeout=PATIENCE_S).ranks[0]
    assert (rank.exit_code, rank.signal) in ((143, None), (None, signal.SIGTERM))


def test_a_restarted_backend_finds_the_batch_attempt_as_one_rank(cluster, backend, tmp_path):
    backend.launch(batch(tmp_path, 6, f"touch {tmp_path}/up\nsleep 300\n"))
    wait_until(lambda: (tmp_path / "up").exists(), PATIENCE_S, "the script up")
    again = SlurmBackend(tmp_path, env=cluster.env(), launch_timeout_s=PATIENCE_S)
    (st,) = again.poll()
    assert [(r.rank, r.running) for r in st.ranks] == [(0, True)]
    again.signal(6, 1, signal.SIGTERM)
    assert wait_done(again, 6, timeout=PATIENCE_S).done
