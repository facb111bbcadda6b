"""Images on the Slurm backend (backends/slurm/pyxis.py): pyxis's options as the batch script's
srun gets them, and pyxis found (or not) from `srun --help`."""

from __future__ import annotations

import shutil
import stat

import pytest

from tests.slurm_cluster import slurm_available
from trainyard.backends.base import ContainerLaunch
from trainyard.backends.slurm import pyxis
from trainyard.spec.container import ContainerOptions
from trainyard.spec.container_mounts import parse_mounts

DIGEST = "sha256:" + "ab" * 32


def test_the_options_pass_through_pinned_in_enroot_words():
    opts = ContainerOptions("nvcr.io/nvidia/pytorch:24.01-py3", mounts=parse_mounts("/data:/data:ro"),
                            workdir="/w", env=("HF_HOME",), writable=False)
    out = pyxis.srun_options(ContainerLaunch(opts, f"nvcr.io/nvidia/pytorch:24.01-py3@{DIGEST}", DIGEST),
                             ["/jobs/7", "/home/u/work", "/jobs/7"])
    assert out[0] == f"--container-image=nvcr.io#nvidia/pytorch:24.01-py3@{DIGEST}"
    assert "--container-mounts=/data:/data:ro,/jobs/7:/jobs/7,/home/u/work:/home/u/work" in out
    assert "--container-workdir=/w" in out and "--container-env=HF_HOME" in out
    assert "--container-readonly" in out and "--no-container-mount-home" in out
    assert "--no-container-remap-root" in out and "--no-container-entrypoint" in out


def test_pyxis_is_found_from_srun_help(tmp_path):
    srun = tmp_path / "srun"
    srun.write_text("#!/bin/sh\necho '      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH'\n")
    srun.chmod(srun.stat().st_mode | stat.S_IXUSR)
    assert pyxis.has_pyxis(str(srun), {"PATH": "/usr/bin:/bin"})
    srun.write_text("#!/bin/sh\necho 'Usage: srun [OPTIONS(0)...]'\n")
    assert not pyxis.has_pyxis(str(srun), {"PATH": "/usr/bin:/bin"})
    assert not pyxis.has_pyxis(str(tmp_path / "absent"), {"PATH": "/usr/bin:/bin"})


@pytest.mark.slurm
def test_this_machines_slurm_has_no_pyxis():
    # the test cluster is Debian's Slurm without the plugin: images there fail with a clear cause
    why = slurm_available()  # installs Slurm first where it may (root)
    if why:
        pytest.skip(why)
    assert not pyxis.has_pyxis(shutil.which("srun") or "srun", {"PATH": "/usr/bin:/bin"})
