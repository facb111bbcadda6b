"""A container rank's bundle binds its node's staged datasets read-only at the same path
(backends/local/container.py `write_bundle(datasets=)`), so that `$TRAINYARD_DATASET_<NAME>` names
them inside too and the job cannot alter the shared copy. The bundle only: the container runs in
tests/backends/local/test_container.py where runc is installed."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from trainyard.backends.base import ContainerLaunch
from trainyard.backends.local import container
from trainyard.images.types import CachedImage, ImageConfig
from trainyard.spec.container import ContainerOptions

from tests.backends.helpers import make_spec

DIGEST = "sha256:" + "e" * 64


def _bundle(tmp_path: Path, remap_root: bool) -> dict:
    rootfs = tmp_path / "layer"
    rootfs.mkdir()
    image = CachedImage(DIGEST, "127.0.0.1:5000/test/img", (str(rootfs),), ImageConfig(), str(tmp_path / "lock"), 0)
    data = tmp_path / "datasets" / "node0" / ("ab" * 32) / "data"
    data.parent.mkdir(parents=True)
    data.write_text("x\n")
    options = ContainerOptions(image="127.0.0.1:5000/test/img", remap_root=remap_root)
    spec = replace(make_spec(tmp_path, 1, ["/bin/true"]),
                   container=ContainerLaunch(options, f"127.0.0.1:5000/test/img@{DIGEST}", DIGEST),
                   dataset_paths={"node0": {"TRAINYARD_DATASET_CORPUS": str(data)}})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    plan = container.rank_plan(tmp_path, spec, run_dir, 0, image, "/bin/false")
    container.write_bundle(plan, spec, image, {"TRAINYARD_DATASET_CORPUS": str(data)}, {"path": str(tmp_path / "tmp")},
                           [], datasets=[str(data)])
    config = json.loads((Path(plan["bundle"]) / "config.json").read_text())
    targets = Path(plan["bundle"]) / "targets.json"
    return {"data": str(data), "config": config, "targets": json.loads(targets.read_text()) if targets.exists() else None}


def test_a_staged_dataset_is_bound_read_only_at_its_own_path(tmp_path):
    got = _bundle(tmp_path, remap_root=False)
    [m] = [m for m in got["config"]["mounts"] if m["destination"] == got["data"]]
    assert m["source"] == got["data"] and "ro" in m["options"] and "rw" not in m["options"]
    assert "TRAINYARD_DATASET_CORPUS=" + got["data"] in got["config"]["process"]["env"]


def test_with_root_remapped_its_mount_point_is_made_as_a_file(tmp_path):
    got = _bundle(tmp_path, remap_root=True)
    data = got["data"]
    [t] = [t for t in got["targets"]["targets"] if t[1] in (data, data.removeprefix("/tmp/"))]
    assert t[2] is False  # a file's mount point, not a directory's
