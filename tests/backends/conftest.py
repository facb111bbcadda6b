"""The backend under test, on a fresh data dir; every test must leave no rank process behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.backends.helpers import NODES, marked_processes
from trainyard.backends import LocalBackend


@pytest.fixture
def backend(tmp_path: Path):
    be = LocalBackend(tmp_path, NODES)
    yield be
    for a in be.poll():
        be.release(a.job_id, a.attempt)
    assert marked_processes(tmp_path) == []
