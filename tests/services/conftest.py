"""Fixtures of the accounting tests (test_accounting.py, test_usage_report.py): a plane without its
loop on SQLite and on PostgreSQL, and the written history of `acct_history.History` in it."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.plane import Plane
from tests.services.acct_history import NOW, History
from tests.store.test_store import pg_url  # noqa: F401 (the fixture)
from trainyard.store.db import sqlite_url


@pytest.fixture(params=["sqlite", "postgresql"])
def acct_plane(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Plane]:
    url = sqlite_url(tmp_path) if request.param == "sqlite" else request.getfixturevalue("pg_url")
    p = Plane(tmp_path / "yard", db_url=url, start=False)
    p.cp.clock = lambda: NOW  # the API's now: the history's running job has run 1.5 h
    yield p
    p.cp.stop()


@pytest.fixture
def hist(acct_plane: Plane) -> History:
    return History(acct_plane)
