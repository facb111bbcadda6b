"""Jobs that cannot escape, end to end through a real `yard up` on the local backend (issue 15):
a torchrun job (its workers in sessions of their own) requeued by the plane checkpoints, ends
REQUEUED, leaves no process behind, and resumes to the very losses of an uninterrupted run (also
under `accelerate launch`, where it is installed); the
same as an #SBATCH script across a `kill -9` of the plane; a job that daemonizes is cancelled with
nothing left, also after the plane was killed and restarted.

Processes are found by scanning /proc for a mark in their environment, which every process of a
job inherits whatever session it makes."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

from tests.backends.helpers import processes_with
from tests.runtime.helpers import SCRIPT, final_by_step, torchrun
from tests.yard_cluster import YardCluster
from trainyard.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="containment tests run as root")]

MARK = "TY_CONTAINED"
STEPS = ["--steps", "24", "--checkpoint-every", "4", "--step-sleep", "0.25"]
# The same steps (so the same losses), 1 s apart: the job must still be training after the plane's
# kill -9 and restart, which took 18 s once on a loaded machine (6 s of steps had all run by then).
SLOW_STEPS = [*STEPS[:-1], "1.0"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
ESCAPER = Path(__file__).resolve().parents[1] / "backends" / "contain" / "escaper.py"
# The tests of the module-scoped reference run on one xdist worker (`make test`'s --dist loadgroup):
# unmarked, each worker they land on runs its own reference torchrun.
SAME_REFERENCE = pytest.mark.xdist_group("contained-reference")


def processes(mark: str, attempt: int | None = None) -> list[int]:
    """Live processes carrying `MARK=mark` (and of `attempt`, when given) in their environment."""
    return processes_with(**{MARK: mark}, **({"TRAINYARD_ATTEMPT": attempt} if attempt else {}))


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


@pytest.fixture
def yc(tmp_path):
    c = YardCluster(tmp_path / "cluster", "local")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, str]:
    """Losses of an uninterrupted run under plain torchrun (no control plane), by step (worker 0)."""
    out = tmp_path_factory.mktemp("reference")
    assert torchrun(out, 2, STEPS, timeout=300) == 0, (out / "log-a0-torchrun.txt").read_text()[-3000:]
    return {s: r["loss"] for s, r in final_by_step(out, 0).items()}


def _requeue_and_check(yc: YardCluster, job: int, mark: str, out: Path, reference: dict[int, str]) -> dict:
    yc.wait_committed(job, 4, timeout=240)
    workers = processes(mark, attempt=1)
    assert len(workers) >= 3  # torchrun's agent and its two workers (the shell of a script, too)
    assert len({os.getsid(p) for p in workers}) >= 2  # the workers are in sessions of their own
    yc.yard("requeue", str(job))
    j = yc.wait(job, lambda j: bool(j["attempts"]) and j["attempts"][0]["ended_at"] is not None, timeout=240)
    first = j["attempts"][0]
    assert first["state"] == "REQUEUED" and "checkpointed step" in first["reason"], first
    assert processes(mark, attempt=1) == []  # nothing of attempt 1 outlived it
    done = yc.wait(job, "COMPLETED", timeout=300)
    assert [a["state"] for a in done["attempts"]] == ["REQUEUED", "COMPLETED"]
    got = {s: r["loss"] for s, r in final_by_step(out, 0).items()}
    assert got == reference  # bit for bit (hex floats), every step
    assert {r["attempt"] for r in final_by_step(out, 0).values()} == {1, 2}
    wait_for(lambda: not processes(mark), 30, "no process of the job left")
    return done


def _accelerate() -> list[str]:
    """`accelerate launch` for two local processes (its torchrun-based multi-process mode, on CPU)."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(free_port())]


@SAME_REFERENCE
@pytest.mark.parametrize("launcher", ["torchrun", pytest.param("accelerate", marks=pytest.mark.skipif(
    importlib.util.find_spec("accelerate") is None, reason="accelerate is not installed (pip install accelerate)"))])
def test_a_launched_job_requeued_by_the_plane_checkpoints_leaves_nothing_and_resumes_exactly(
        yc, tmp_path, reference, launcher):
    out, mark = tmp_path / "out", f"{launcher}-{tmp_path.name}"
    cmd = TORCHRUN if launcher == "torchrun" else _accelerate()
    job = yc.submit("-G", "1", "-A", "vision", "--env", f"{MARK}={mark}", "-D", str(tmp_path), "--",
                    *cmd, str(SCRIPT), "--out", str(out), *STEPS)
    _requeue_and_check(yc, job, mark, out, reference)


@SAME_REFERENCE
def test_an_sbatch_torchrun_job_survives_a_kill_9_of_the_plane_and_is_requeued_cleanly(yc, tmp_path, reference):
    out, mark = tmp_path / "out", f"sbatch-{tmp_path.name}"
    script = tmp_path / "train.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH --job-name=torchrun-sbatch
#SBATCH --gpus=1
#SBATCH --account=vision
#SBATCH --mem=4G
#SBATCH --cpus-per-task=2
export {MARK}={mark}
{" ".join(TORCHRUN)} {SCRIPT} --out {out} {" ".join(SLOW_STEPS)}
""")
    job = yc.submit("-D", str(tmp_path), str(script))
    yc.wait(job, "RUNNING", timeout=120)
    wait_for(lambda: (out / "trace-rank0.jsonl").exists(), 240, "the first step")
    before = set(processes(mark, attempt=1))
    yc.server.kill9()  # the plane dies; the job runs on
    time.sleep(1)
    assert set(processes(mark, attempt=1)) >= before
    yc.restart()
    j = yc.wait(job, "RUNNING", timeout=60)
    assert j["attempt"] == 1 and len(j["attempts"]) == 1  # re-attached, not run again
    done = _requeue_and_check(yc, job, mark, out, reference)
    assert done["mem_mib"] == 4096 and done["cpus_per_task"] == 2


def test_a_daemonizing_job_is_cancelled_with_nothing_left_also_across_a_plane_restart(yc, tmp_path):
    escaped, mark = tmp_path / "escaped", f"daemon-{tmp_path.name}"
    escaped.mkdir()
    job = yc.submit("-G", "2", "-A", "vision", "--env", f"{MARK}={mark}", "-D", str(tmp_path), "--",
                    sys.executable, str(ESCAPER), str(escaped), "wait")
    wait_for((escaped / "ready").exists, 120, "the job to daemonize")
    daemons = [int(p) for p in (escaped / "pids").read_text().split()]
    yc.server.kill9()
    yc.restart()
    assert yc.wait(job, "RUNNING", timeout=60)["attempt"] == 1
    yc.yard("cancel", str(job))
    yc.wait(job, "CANCELLED", timeout=120)
    wait_for(lambda: not processes(mark), 30, f"no process of the job left (left: {processes(mark)})")
    assert all(p not in processes(mark) for p in daemons)


def test_a_job_over_its_mem_is_killed_by_the_kernel_and_ends_out_of_memory(yc, tmp_path):
    hog = "x = bytearray(600 * 2**20); print('survived', flush=True)"
    job = yc.submit("-G", "1", "-A", "vision", "--mem", "150M", "-D", str(tmp_path), "--", sys.executable, "-c", hog)
    j = yc.wait(job, lambda j: j["state"] not in ("PENDING", "RUNNING", "COMPLETING"), timeout=120)
    assert j["state"] == "OUT_OF_MEMORY" and j["attempts"][0]["cause"] == "oom", j
    assert "the kernel killed a process of rank 0" in j["reason"] and j["retries"] == 0
