"""The Slurm backend's own facts beyond the conformance suite, on the real 2-node test cluster
(tests/slurm_cluster.py; skipped with the reason where Slurm cannot be installed or we are not root)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends.helpers import make_spec, marked_processes, wait_until
from tests.slurm_cluster import SlurmCluster, slurm_available
from trainyard.backends.base import BackendError
from trainyard.backends.slurm import SlurmBackend

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
