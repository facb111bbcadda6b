"""The Slurm backend's own facts beyond the conformance suite, on the real 2-node test cluster
(tests/slurm_cluster.py; skipped with the reason where Slurm cannot be installed or we are not root)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends.helpers import make_spec, marked_processes, wait_until
from tests.slurm_cluster import SlurmCluster, slurm_available
from trainyard.backends.base import BackendError
from trainyard.backends.slurm.backend import SlurmBackend

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm-backend")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = slurm_available()
    if reason:
        pytest.skip(reason)
    c = SlurmCluster(tmp_path_factory.mktemp("slurm-backend"))
    c.start()
    try:
        yield c
    finally:
        c.stop()


def test_a_slurmctld_that_does_not_answer_is_no_news_not_lost_ranks(cluster: SlurmCluster, tmp_path: Path) -> None:
    """Under load slurmctld can be too slow for squeue; that used to read as "the job is gone":
    every rank lost, its job NODE_FAIL and requeued though nothing had happened to it."""
    be = SlurmBackend(tmp_path, env=cluster.env(), launch_timeout_s=120)
    be.launch(make_spec(tmp_path, 1, ["sleep", "300"], ranks=[(0, "n1", (0,)), (1, "n2", (0,))]))
    ctld = cluster.pids()["slurmctld"]
    os.kill(ctld, signal.SIGSTOP)  # alive, answering nothing (MessageTimeout=5 s in the test cluster)
    try:
        with pytest.raises(BackendError, match="did not answer"):
            be.poll()
    finally:
        os.kill(ctld, signal.SIGCONT)
    st = be.poll()[0]
    assert [(r.running, r.lost) for r in st.ranks] == [(True, False)] * 2
    be.release(1, 1)
    wait_until(lambda: marked_processes(tmp_path) == [], timeout=60, what="the ranks gone")


def test_a_launch_waiting_on_slurm_holds_up_neither_poll_nor_signal(cluster: SlurmCluster, tmp_path: Path) -> None:
    """`launch` waits until slurmctld has scheduled the batch job and its ranks have started; the
    control loop runs it on a thread of its own (`launch_waits`), so the backend must meanwhile
    answer `poll` and `signal` for the attempts it knows, and refuse the same attempt twice."""
    assert SlurmBackend.launch_waits
    be = SlurmBackend(tmp_path, env=cluster.env(), launch_timeout_s=120)
    be.launch(make_spec(tmp_path, 1, ["sleep", "300"], ranks=[(0, "n1", (0,))]))
    holder = cluster.sbatch("--nodelist=n2", "--exclusive", "--wrap=sleep 120")  # n2 busy: job 2 pends
    errors: list[BaseException] = []

    def launch_2() -> None:
        try:
            be.launch(make_spec(tmp_path, 2, ["sleep", "300"], ranks=[(0, "n2", (0,))]))
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    t = threading.Thread(target=launch_2)
    t.start()
    try:
        wait_until(lambda: (tmp_path / "jobs" / "2").exists(), timeout=30, what="job 2 submitted")
        time.sleep(1)  # it waits in Slurm's queue behind the holder
        assert t.is_alive()
        started = time.monotonic()
        states = be.poll()
        be.signal(1, 1, signal.SIGUSR1)  # to the running attempt, meanwhile
        assert time.monotonic() - started < 10  # not the launch's wait (up to 120 s)
        assert [(s.job_id, s.attempt) for s in states] == [(1, 1)]
        # sleep dies of SIGUSR1: the signal reached the rank while the launch still waited
        wait_until(lambda: not be.poll()[0].ranks[0].running, timeout=30, what="job 1 signalled")
        assert t.is_alive()
        with pytest.raises(BackendError, match="already launched"):
            be.launch(make_spec(tmp_path, 2, ["sleep", "300"], ranks=[(0, "n2", (0,))]))
    finally:
        cluster.run("scancel", str(holder), check=False)
    t.join(90)
    assert not t.is_alive() and errors == []
    assert sorted((s.job_id, s.attempt) for s in be.poll()) == [(1, 1), (2, 1)]
    be.release(1, 1)
    be.release(2, 1)
    wait_until(lambda: marked_processes(tmp_path) == [], timeout=60, what="the ranks gone")
