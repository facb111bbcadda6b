"""The conformance suite (tests/backends/conformance.py) on the Slurm backend, against the real
2-node test cluster of tests/slurm_cluster.py (one cluster for the whole module; skipped with the
reason where Slurm cannot be installed or we are not root).

Slurm sets SLURM_* itself, so the environment checks there are of consistency with the contract.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends.conformance import Conformance, ProcessHarness
from tests.slurm_cluster import SlurmCluster, slurm_available
from trainyard.backends.base import Backend
from trainyard.backends.slurm.backend import SlurmBackend
from trainyard.contracts import JobDir

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm-conformance")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = slurm_available()
    if reason:
        pytest.skip(reason)
    c = SlurmCluster(tmp_path_factory.mktemp("slurm-conformance"))
    c.start()
    try:
        yield c
    finally:
        c.stop()


class SlurmHarness(ProcessHarness):
    nodes = ("n1", "n2")
    emulates_slurm = False
    terminal_rank_env = False  # `srun --overlap --pty` gets the step's environment (SLURM_*), not RANK
    patience = 3.0  # sbatch → slurmctld → slurmd → srun → task takes seconds, more under load

    def __init__(self, data_dir: Path, cluster: SlurmCluster) -> None:
        self.cluster = cluster
        super().__init__(data_dir)

    def make(self) -> Backend:
        return SlurmBackend(self.data_dir, env=self.cluster.env(), launch_timeout_s=60 * self.patience)

    def freeze(self, job_id: int, attempt: int, world: int) -> None:
        self.cluster.run("scancel", "--signal=STOP", self._slurm_id(job_id, attempt))

    def thaw(self, job_id: int, attempt: int, world: int) -> None:
        self.cluster.run("scancel", "--signal=CONT", self._slurm_id(job_id, attempt))

    def _slurm_id(self, job_id: int, attempt: int) -> str:
        meta = json.loads((JobDir.of(self.data_dir, job_id).attempt_run(attempt) / "attempt.json").read_text())
        return str(meta["slurm_job_id"])

    def leftovers(self) -> list[str]:
        queued = [f"slurm job {line}" for line in self.cluster.run("squeue", "-h", "-o", "%i %T").stdout.splitlines()
                  if line.strip()]
        return super().leftovers() + queued


@pytest.fixture
def harness(tmp_path: Path, cluster: SlurmCluster) -> Iterator[SlurmHarness]:
    cluster.run("scancel", "--full", "--partition=main", check=False)  # what an earlier failure left
    cluster.wait_for(lambda: not cluster.run("squeue", "-h").stdout.strip(), 30, "an empty queue")
    h = SlurmHarness(tmp_path, cluster)
    yield h
    h.cleanup()


class TestConformance(Conformance):
    pass
