"""The conformance suite (tests/backends/conformance.py) on the local backend: real processes,
two emulated nodes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends.conformance import Conformance, ProcessHarness
from tests.backends.helpers import NODES
from trainyard.backends.base import Backend
from trainyard.backends.local.backend import LocalBackend


class LocalHarness(ProcessHarness):
    nodes = ("node0", "node1")

    def make(self) -> Backend:
        return LocalBackend(self.data_dir, NODES)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[LocalHarness]:
    h = LocalHarness(tmp_path)
    yield h
    h.cleanup()


class TestConformance(Conformance):
    pass
