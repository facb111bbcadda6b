"""Issue 34, point 7: a rank killed from outside is blamed, not the plane's stop of the others.

A real plane, a 2-rank job of real processes; rank 1's command is SIGKILLed by another process (as
an account's `kill -9`, or the kernel, would). The plane then stops rank 0 with its own SIGTERM;
the attempt's reason must name SIGKILL and rank 1 ("Signal SIGTERM on rank 0" was reported before),
also when the stop went on to SIGKILL rank 0 (which ignores SIGTERM here).
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.plane import Plane, job_dir, script, wait_until

# Each rank records its pid, then waits; `ignore_term` makes rank 0 outlast the plane's SIGTERM.
RANK = """
import os, pathlib, signal, sys, time
if os.environ['RANK'] == '0' and sys.argv[1] == 'ignore_term':
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(os.environ['TRAINYARD_CHECKPOINT_DIR'], 'pid-' + os.environ['RANK']).write_text(str(os.getpid()))
time.sleep(120)
"""


@pytest.fixture
def plane(tmp_path):
    p = Plane(tmp_path / "yard", kill_wait_s=1.0)
    yield p
    p.stop()


@pytest.mark.parametrize("rank0", ["dies_of_term", "ignore_term"])
def test_a_rank_sigkilled_from_outside_is_the_cause_not_the_planes_stop_of_the_others(plane, rank0):
    j = plane.submit(command=[*script(RANK), rank0], team="vision", gpus=2)["id"]
    plane.wait(j, "RUNNING")
    ck = job_dir(plane.cp.data_dir, j) / "checkpoints"
    wait_until(lambda: (ck / "pid-0").exists() and (ck / "pid-1").exists(), timeout=30)
    os.kill(int((ck / "pid-1").read_text()), signal.SIGKILL)  # from outside the plane

    def ended() -> list[dict]:
        events = plane.admin.get(f"/api/v1/jobs/{j}/events").json()["events"]
        return [e for e in events if e["kind"].startswith("job.") and e["data"].get("attempt") == 1
                and e["data"].get("cause")]

    wait_until(ended, timeout=60)
    [end] = ended()  # the attempt's outcome: a plain job (no runtime) is told by its signal, as Slurm tells it
    assert (end["kind"], end["data"]["cause"], end["data"]["signal"]) == ("job.failed", "signal", signal.SIGKILL), end
    assert ": Signal SIGKILL on rank 1 (not sent by trainyard)" in end["message"], end["message"]
    events = plane.admin.get(f"/api/v1/jobs/{j}/events").json()["events"]
    assert [e["data"]["rank"] for e in events if e["kind"] == "job.rank_failed"] == [1]
    sent = [e["data"]["signal"] for e in events if e["kind"] == "job.signal"]
    assert sent[0] == signal.SIGTERM and (rank0 == "dies_of_term" or signal.SIGKILL in sent), sent
    failed = plane.wait(j, "FAILED")  # not retried: only the class's requeue_exit retries a plain job
    assert "Signal SIGKILL on rank 1" in failed["reason"] and failed["retries"] == 0, failed
