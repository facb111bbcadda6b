"""The conformance suite (tests/backends/conformance.py) on the fake backend: the same bodies,
scripted ranks on a FakeClock (no process, no wall time)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends.conformance import Conformance, FakeHarness
from tests.backends.helpers import NODES


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[FakeHarness]:
    h = FakeHarness(tmp_path, NODES)
    yield h
    h.cleanup()


class TestConformance(Conformance):
    pass
