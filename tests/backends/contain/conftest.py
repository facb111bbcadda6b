"""A local backend per containment mode this machine offers; each test leaves nothing running."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.backends.helpers import NODES, marked_processes, wait_until
from trainyard.backends import LocalBackend
from trainyard.backends.contain import mounts

ESCAPER = [sys.executable, str(Path(__file__).with_name("escaper.py"))]


def available_modes() -> list[str]:
    """cgroup1 and cgroup2 where their hierarchies are writable (root on this machine), always subreaper."""
    found = mounts.find()
    modes = []
    if os.geteuid() == 0 and "freezer" in found.v1:
        modes.append("cgroup1")
    if os.geteuid() == 0 and found.v2 is not None:
        modes.append("cgroup2")
    return modes + ["subreaper"]


@pytest.fixture(params=available_modes())
def mode(request) -> str:
    return request.param


@pytest.fixture
def contained(tmp_path: Path, mode: str):
    be = LocalBackend(tmp_path, NODES, containment=mode)
    assert be.containment == mode
    yield be
    for a in be.poll():
        be.release(a.job_id, a.attempt)
    wait_until(lambda: not marked_processes(tmp_path), 30, "nothing left running")
    be.close()
