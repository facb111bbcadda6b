"""Placement options reach real Slurm (issue 17 item 3): the Slurm backend passes a job's
`-C/--constraint`, GPU model (`--gres=gpu:TYPE:N`), `--exclude` and `--exclusive` on to sbatch
beside the engine's `--nodelist`, so slurmctld checks the same rules: on the 2-node test cluster
(tests/slurm_cluster.py) with node features and a GPU type, the job shows them in `scontrol show
job`, and one pinned to a node without the feature is refused by Slurm itself."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends.helpers import make_spec, marked_processes, wait_until
from tests.slurm_cluster import SlurmCluster, slurm_available
from trainyard.backends.base import BackendError, Constraints
from trainyard.backends.slurm.backend import SlurmBackend

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm-placement")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = slurm_available()
    if reason:
        pytest.skip(reason)
    c = SlurmCluster(tmp_path_factory.mktemp("slurm-placement"), features={"n1": "ib,nvme"}, gpu_type="a100")
    c.start()
    try:
        yield c
    finally:
        c.stop()


def test_a_constraint_and_a_gpu_model_reach_slurm(cluster: SlurmCluster, tmp_path: Path) -> None:
    be = SlurmBackend(tmp_path, env=cluster.env(), launch_timeout_s=120)
    spec = dataclasses.replace(make_spec(tmp_path, 1, ["sleep", "300"], ranks=[(0, "n1", (0, 1))]),
                               constraints=Constraints("ib&nvme", "a100", ("n2",), True))
    be.launch(spec)
    try:
        info = cluster.job_info(be._attempts[(1, 1)].slurm_id)
        text = " ".join(f"{k}={v}" for k, v in info.items())
        assert info.get("Features") == "ib&nvme", text
        assert "gpu:a100" in text and "n2" in info.get("ExcNodeList", ""), text
        assert info.get("OverSubscribe") == "NO", text  # --exclusive
    finally:
        be.release(1, 1)
    wait_until(lambda: marked_processes(tmp_path) == [], timeout=60, what="the ranks gone")


def test_slurm_refuses_a_node_without_the_feature(cluster: SlurmCluster, tmp_path: Path) -> None:
    be = SlurmBackend(tmp_path, env=cluster.env(), launch_timeout_s=60)
    spec = dataclasses.replace(make_spec(tmp_path, 2, ["sleep", "300"], ranks=[(0, "n2", (0,))]),
                               constraints=Constraints("nvme"))
    with pytest.raises(BackendError, match="Slurm refused the job"):
        be.launch(spec)
