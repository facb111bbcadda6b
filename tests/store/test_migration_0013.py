"""Migration 0013 (a job's image: `jobs.container`, `jobs.image_digest`, `attempts.image_digest`)
up and down on SQLite and PostgreSQL, with rows in the tables: an older store gains the columns
empty (its jobs are bare), the JSON record round-trips, and a downgrade drops exactly them and
keeps every row."""

from __future__ import annotations

import json

from alembic import command
from alembic.config import Config
from sqlalchemy import inspect, text

from tests.store.test_store import pg_url, url  # noqa: F401 (fixtures)
from trainyard.spec.container import ContainerOptions
from trainyard.spec.container_mounts import parse_mounts
from trainyard.store.db import MIGRATIONS, make_engine

DIGEST = "sha256:" + "ab" * 32


def _alembic(conn, verb: str, rev: str) -> None:  # noqa: ANN001
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = conn
    getattr(command, verb)(cfg, rev)


def _columns(engine, table: str) -> set[str]:  # noqa: ANN001
    return {c["name"] for c in inspect(engine).get_columns(table)}


def _a_job(conn, **extra: object) -> None:  # noqa: ANN001
    cols = {"name": "j", "user": "u", "team": "t", "job_class": "training", "pool": "default", "state": "PENDING",
            "reason": "", "held": False, "command": "[\"true\"]", "workdir": "/", "env": "{}", "nodes_min": 1,
            "nodes_max": 1, "gpus": 1, "submit_time": 0.0, "queued_since": 0.0, "attempt": 1, "progress_s": 0.0,
            "attained_gpu_s": 0.0, "stop_stage": 0, **extra}
    names = ", ".join(f'"{k}"' for k in cols)  # quoted: `user` is a keyword of PostgreSQL's
    conn.execute(text(f"INSERT INTO jobs ({names}) VALUES ({', '.join(':' + k for k in cols)})"), cols)
    conn.execute(text("INSERT INTO attempts (job_id, attempt, placement, started_at, state, reason) "
                      "VALUES ((SELECT max(id) FROM jobs), 1, '[]', 1.0, 'RUNNING', '')"))


def test_0013_up_and_down_with_rows(url: str) -> None:  # noqa: F811
    engine = make_engine(url)
    try:
        with engine.begin() as c:
            _alembic(c, "upgrade", "0012")
            _a_job(c)  # a job stored before images
        assert "container" not in _columns(engine, "jobs")
        with engine.begin() as c:
            _alembic(c, "upgrade", "0013")
        assert {"container", "image_digest"} <= _columns(engine, "jobs")
        assert "image_digest" in _columns(engine, "attempts")
        record = ContainerOptions("127.0.0.1:5000/team/img:1", parse_mounts("/data:/data:ro"), env=("HF_HOME",)).to_record()
        with engine.begin() as c:
            assert c.execute(text("SELECT container, image_digest FROM jobs")).one() == (None, None)  # bare
            _a_job(c)
            c.execute(text("UPDATE jobs SET container = :c, image_digest = :d WHERE id = (SELECT max(id) FROM jobs)"),
                      {"c": json.dumps(record), "d": DIGEST})
            c.execute(text("UPDATE attempts SET image_digest = :d WHERE job_id = (SELECT max(id) FROM jobs)"),
                      {"d": DIGEST})
        with engine.connect() as c:
            raw, digest = c.execute(text("SELECT container, image_digest FROM jobs ORDER BY id DESC")).first()
            got = raw if isinstance(raw, dict) else json.loads(raw)
            assert ContainerOptions.from_record(got).to_record() == record and digest == DIGEST
            assert c.execute(text("SELECT count(*) FROM attempts WHERE image_digest = :d"), {"d": DIGEST}).scalar() == 1
        with engine.begin() as c:
            _alembic(c, "downgrade", "0012")
        assert not {"container", "image_digest"} & _columns(engine, "jobs")
        assert "image_digest" not in _columns(engine, "attempts")
        with engine.connect() as c:  # every row kept
            assert c.execute(text("SELECT count(*) FROM jobs")).scalar() == 2
            assert c.execute(text("SELECT count(*) FROM attempts")).scalar() == 2
        with engine.begin() as c:  # and up again
            _alembic(c, "upgrade", "head")
        assert "container" in _columns(engine, "jobs")
    finally:
        engine.dispose()
