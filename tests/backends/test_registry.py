"""Backends by name: the registry, the control plane asking it, and `yard up --backend` checking it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.plane import YARD
from trainyard.backends import registry
from trainyard.backends.base import BackendError, NodeInfo
from trainyard.backends.local.backend import LocalBackend
from trainyard.control.lifecycle.plane import ControlPlane
from trainyard.control.lifecycle.plane_builder import PlaneSettings, build_plane


class Recorder:
    """A kind that records what the plane asked of it; its backend is a plain LocalBackend."""

    def __init__(self, found: list[NodeInfo]) -> None:
        self.found, self.created, self.discovered, self.checked = found, [], [], []

    def kind(self, name: str = "recorder") -> registry.BackendKind:
        return registry.BackendKind(name, "records the plane's calls", self.create, self.discover,
                                    options=frozenset({"partition"}), check=self.checked.append)

    def create(self, data_dir: Path, nodes: list[NodeInfo], options) -> LocalBackend:  # noqa: ANN001
        self.created.append((nodes, dict(options)))
        return LocalBackend(data_dir, nodes)

    def discover(self, data_dir: Path, options) -> list[NodeInfo]:  # noqa: ANN001
        self.discovered.append(dict(options))
        return self.found


@pytest.fixture
def recorder():
    rec = Recorder([NodeInfo("r0", 2, "x100", 40960, block="b1", rack="r7"), NodeInfo("r1", 2, "x100", 40960)])
    registry.register(rec.kind())
    yield rec
    registry._KINDS.pop("recorder", None)


def close(cp: ControlPlane) -> dict:
    """Close the plane (never started); returns the configuration it stored, as data."""
    with cp.store.session() as s:
        doc = yaml.safe_load(cp.configs.current(s).text)
    cp.backend.close()
    cp.store.close()
    return doc


def test_built_in_backends_are_known_by_name_and_an_unknown_one_is_refused_listing_them():
    assert registry.names() == ["local", "slurm", "fake"]
    assert registry.get("local").options == {"nodes", "gpus_per_node", "containment", "private_tmp", "job_python"}
    assert registry.get("slurm").options == {"partition", "job_python"}
    with pytest.raises(ValueError, match=r"unknown backend 'kubernetes'; known: local, slurm, fake"):
        registry.get("kubernetes")


def test_the_plane_discovers_nodes_once_and_creates_the_backend_on_the_configured_ones(tmp_path, recorder):
    doc = close(build_plane(PlaneSettings(tmp_path, backend_kind="recorder", backend_options={"partition": "gpu"})))
    assert recorder.checked == [{"partition": "gpu"}] and recorder.discovered == [{"partition": "gpu"}]
    stored = doc["cluster"]["nodes"]
    assert stored[0] == {"name": "r0", "gpus": 2, "gpu_model": "x100", "gpu_mem_gb": 40.0, "block": "b1", "rack": "r7"}
    assert "block" not in stored[1]
    nodes, options = recorder.created[0]
    assert [(n.name, n.gpus, n.gpu_mem_mib) for n in nodes] == [("r0", 2, 40960), ("r1", 2, 40960)]
    assert options == {"partition": "gpu"}

    # A configuration stored later is what the backend gets, whatever discovery would say.
    doc["cluster"]["nodes"][0]["gpu_mem_gb"] = 80
    close(build_plane(PlaneSettings(tmp_path, backend_kind="recorder", config_text=yaml.safe_dump(doc))))
    assert recorder.discovered == [{"partition": "gpu"}]  # not again: a configuration is stored
    assert [n.gpu_mem_mib for n in recorder.created[1][0]] == [81920, 40960]


def test_a_backend_that_cannot_run_here_fails_before_anything_is_stored(tmp_path):
    def refuse(options) -> None:  # noqa: ANN001
        raise BackendError("no cluster here")

    registry.register(registry.BackendKind("refusing", "cannot run", lambda *a: None, lambda *a: [],  # type: ignore[arg-type,return-value]
                                           check=refuse))
    try:
        with pytest.raises(BackendError, match="no cluster here"):
            build_plane(PlaneSettings(tmp_path, backend_kind="refusing"))
    finally:
        registry._KINDS.pop("refusing", None)
    cp = build_plane(PlaneSettings(tmp_path))  # nothing was stored: the first real start makes the default configuration
    with cp.store.session() as s:
        assert cp.configs.current(s).version == 1
    close(cp)


@pytest.mark.parametrize("args,words", [
    (("--backend", "kubernetes"), ["--backend", "local, slurm, fake", "'kubernetes'"]),
    (("--partition", "gpu"), ["--partition", "--backend slurm"]),
    (("--backend", "slurm", "--nodes", "2"), ["--nodes", "--backend slurm"]),
])
def test_yard_up_checks_backend_options_against_the_registry(tmp_path, args, words):
    r = subprocess.run([YARD, "up", "--data-dir", str(tmp_path), "--port", "0", *args], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    assert all(w in r.stderr for w in words), r.stderr
    assert not (tmp_path / "trainyard.db").exists()
