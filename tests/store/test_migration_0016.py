"""Migration 0016 (start-time estimates: `jobs.expected_runtime_s`, `start_estimates`,
`estimate_outcomes`) up and down on SQLite and PostgreSQL, with rows: an older job gains no learned
run time, the tables take rows, and a downgrade drops exactly what it added and keeps every job."""

from __future__ import annotations

from sqlalchemy import inspect, text

from tests.store.test_migration_0013 import _a_job, _alembic, _columns
from tests.store.test_store import pg_url, url  # noqa: F401 (fixtures)
from trainyard.store.db import make_engine


def test_0016_up_and_down_with_rows(url: str) -> None:  # noqa: F811
    engine = make_engine(url)
    try:
        with engine.begin() as c:
            _alembic(c, "upgrade", "0015")
            _a_job(c)
        assert "expected_runtime_s" not in _columns(engine, "jobs")
        with engine.begin() as c:
            _alembic(c, "upgrade", "0016")
            assert c.execute(text("SELECT expected_runtime_s FROM jobs")).scalar() is None
            c.execute(text("INSERT INTO start_estimates (job_id, attempt, at, est_start) VALUES (1, 1, 5.0, 50.0)"))
            c.execute(text('INSERT INTO estimate_outcomes (job_id, attempt, job_class, team, "user", queued_since, '
                           "first_at, first_estimate, last_at, last_estimate, started_at, error_s, last_error_s, "
                           "changes) VALUES (1, 1, 'training', 't', 'u', 0, 5, 50, 5, 50, 40, -10, -10, 1)"))
        with engine.connect() as c:
            assert c.execute(text("SELECT est_start FROM start_estimates")).scalar() == 50.0
            assert c.execute(text("SELECT error_s FROM estimate_outcomes")).scalar() == -10.0
        with engine.begin() as c:
            _alembic(c, "downgrade", "0015")
        assert "expected_runtime_s" not in _columns(engine, "jobs")
        assert not {"start_estimates", "estimate_outcomes"} & set(inspect(engine).get_table_names())
        with engine.connect() as c:
            assert c.execute(text("SELECT count(*) FROM jobs")).scalar() == 1
        with engine.begin() as c:
            _alembic(c, "upgrade", "head")
        assert "expected_runtime_s" in _columns(engine, "jobs")
    finally:
        engine.dispose()
