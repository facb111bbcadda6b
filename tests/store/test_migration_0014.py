"""Migration 0014 (`jobs.interactive`: an allocation's record) up and down on SQLite and PostgreSQL,
with rows: older jobs gain it empty (they are batch jobs), the JSON record round-trips, a
downgrade drops exactly it and keeps every row."""

from __future__ import annotations

import json

from sqlalchemy import text

from tests.store.test_migration_0013 import _a_job, _alembic, _columns
from tests.store.test_store import pg_url, url  # noqa: F401 (fixtures)
from trainyard.store.db import make_engine


def test_0014_up_and_down_with_rows(url: str) -> None:  # noqa: F811
    engine = make_engine(url)
    try:
        with engine.begin() as c:
            _alembic(c, "upgrade", "0013")
            _a_job(c)  # a batch job stored before allocations
        assert "interactive" not in _columns(engine, "jobs")
        with engine.begin() as c:
            _alembic(c, "upgrade", "0014")
            assert c.execute(text("SELECT interactive FROM jobs")).scalar() is None
            _a_job(c)
            c.execute(text("UPDATE jobs SET interactive = :i WHERE id = (SELECT max(id) FROM jobs)"),
                      {"i": json.dumps({"kind": "alloc", "exit": 3})})
        with engine.connect() as c:
            raw = c.execute(text("SELECT interactive FROM jobs ORDER BY id DESC")).scalar()
            assert (raw if isinstance(raw, dict) else json.loads(raw)) == {"kind": "alloc", "exit": 3}
        with engine.begin() as c:
            _alembic(c, "downgrade", "0013")
        assert "interactive" not in _columns(engine, "jobs")
        with engine.connect() as c:
            assert c.execute(text("SELECT count(*) FROM jobs")).scalar() == 2
        with engine.begin() as c:
            _alembic(c, "upgrade", "head")
        assert "interactive" in _columns(engine, "jobs")
    finally:
        engine.dispose()
