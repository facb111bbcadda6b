"""Migration 0015 (the goodput ledger, GPU telemetry, suspect nodes) up and down on SQLite and
PostgreSQL, with rows: older attempts gain an empty ledger, the JSON round-trips, a downgrade
drops exactly what it added and keeps every row."""

from __future__ import annotations

import json

from sqlalchemy import inspect, text

from tests.store.test_migration_0013 import _a_job, _alembic, _columns
from tests.store.test_store import pg_url, url  # noqa: F401 (fixtures)
from trainyard.store.db import make_engine


def test_0015_up_and_down_with_rows(url: str) -> None:  # noqa: F811
    engine = make_engine(url)
    try:
        with engine.begin() as c:
            _alembic(c, "upgrade", "0014")
            _a_job(c)
            c.execute(text("INSERT INTO nodes (name, state, reason, updated_at, updated_by) "
                           "VALUES ('n0', 'up', '', 0, '')"))
        assert "ledger" not in _columns(engine, "attempts")
        with engine.begin() as c:
            _alembic(c, "upgrade", "0015")
            assert c.execute(text("SELECT suspect_since, suspect_reason FROM nodes")).one() == (None, "")
            c.execute(text("INSERT INTO gpu_samples (job_id, attempt, node, gpu, time, period_s, util, util_peak, "
                           "mem_mib, source) VALUES (1, 1, 'n0', 0, 10.0, 5.0, 50.0, 90.0, 1024.0, 'emulated')"))
        with engine.connect() as c:
            assert c.execute(text("SELECT util, source FROM gpu_samples")).one() == (50.0, "emulated")
        with engine.begin() as c:
            _alembic(c, "downgrade", "0014")
        assert not {"ledger", "first_output_at", "gpu_summary"} & set(_columns(engine, "attempts"))
        assert "suspect_since" not in _columns(engine, "nodes")
        assert "gpu_samples" not in inspect(engine).get_table_names()
        with engine.connect() as c:
            assert c.execute(text("SELECT count(*) FROM jobs")).scalar() == 1
        with engine.begin() as c:
            _alembic(c, "upgrade", "head")
            c.execute(text("UPDATE nodes SET suspect_since = 5.0"))
        assert "ledger" in _columns(engine, "attempts")
        with engine.connect() as c:
            assert json.loads(json.dumps(c.execute(text("SELECT suspect_since FROM nodes")).scalar())) == 5.0
    finally:
        engine.dispose()
