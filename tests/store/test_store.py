"""The store on SQLite and on PostgreSQL: migrations, round trips, config versions, token hashes,
rollback of a failed submit, concurrent writers; and a whole control plane on PostgreSQL.

PostgreSQL tests run against the server in TRAINYARD_TEST_PG (a libpq connection string; default
`host=127.0.0.1 port=5432 user=postgres dbname=test`), each in a database of its own
(`trainyard_test_<random>`) that is dropped afterwards; they skip, saying why, when no server
answers there.
"""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import func, inspect, select, text

from tests.plane import TWO_TEAMS, Plane, identity_config_text, script
from trainyard.services import auth, config, jobs
from trainyard.services.auth import Principal
from trainyard.services.errors import Forbidden, NotFound, ServiceError, Unauthorized
from trainyard.store.db import MIGRATIONS, Store, open_store, sqlite_url
from trainyard.store.models import Base, ConfigVersionRow, EventRow, JobRow, TokenRow

PG_DSN = os.environ.get("TRAINYARD_TEST_PG", "host=127.0.0.1 port=5432 user=postgres dbname=test")
ADMIN = Principal("root", "admin")
TABLES = {"jobs", "attempts", "events", "nodes", "config_versions", "tokens"}


# -- databases -------------------------------------------------------------------------------------

@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test; dropped afterwards."""
    psycopg = pytest.importorskip("psycopg")
    from psycopg import sql
    try:
        admin = psycopg.connect(PG_DSN, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as e:
        pytest.skip(f"PostgreSQL is not reachable with {PG_DSN!r} (set TRAINYARD_TEST_PG): {str(e).strip()}")
    name = f"trainyard_test_{uuid.uuid4().hex[:12]}"
    info = admin.info
    auth_part = info.user + (f":{info.password}" if info.password else "")
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield f"postgresql://{auth_part}@{info.host}:{info.port}/{name}"
    finally:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    return request.getfixturevalue("pg_url")


@pytest.fixture
def store(url: str) -> Iterator[Store]:
    st = open_store(url)
    try:
        yield st
    finally:
        st.close()


def alembic_head() -> str:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(cfg).get_current_head()


def count(st: Store, model) -> int:  # noqa: ANN001
    with st.session() as s:
        return s.scalar(select(func.count()).select_from(model))


def with_config(st: Store) -> config.ConfigVersion:
    with st.session.begin() as s:
        config.apply(s, identity_config_text(), ADMIN)  # submits run as the test's account
    with st.session() as s:
        return config.ConfigCache().current(s)


# -- migrations ------------------------------------------------------------------------------------

def test_empty_database_is_migrated_to_head_and_reopening_is_idempotent(url: str) -> None:
    st = open_store(url)
    try:
        assert TABLES <= set(inspect(st.engine).get_table_names())
        with st.engine.connect() as c:
            assert c.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [alembic_head()]
            # the migrations build exactly what models.py declares
            assert compare_metadata(MigrationContext.configure(c), Base.metadata) == []
        with st.session.begin() as s:
            config.apply(s, TWO_TEAMS.read_text(), ADMIN)
    finally:
        st.close()
    for _ in range(2):  # re-open: nothing to do, nothing lost
        st = open_store(url)
        try:
            with st.engine.connect() as c:
                assert c.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [alembic_head()]
            assert count(st, ConfigVersionRow) == 1
        finally:
            st.close()


def test_sqlite_runs_in_wal_mode(tmp_path: Path) -> None:
    st = open_store(sqlite_url(tmp_path))
    try:
        with st.engine.connect() as c:
            assert c.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert c.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
            assert c.execute(text("PRAGMA busy_timeout")).scalar() == 10000
            assert c.execute(text("PRAGMA foreign_keys")).scalar() == 1
        with st.session.begin() as s:
            config.apply(s, TWO_TEAMS.read_text(), ADMIN)
        assert (tmp_path / "trainyard.db-wal").exists()
    finally:
        st.close()


# -- rows ------------------------------------------------------------------------------------------

def test_job_row_round_trips(store: Store) -> None:
    placement = [{"node": "node-0", "gpus": [0, 1], "mem_mib": 16384, "share": 0.1},
                 {"node": "node-1", "gpus": [3], "mem_mib": 0, "share": None}]
    values = dict(
        name="résumé ✓", user="alice", team="vision", job_class="training", pool="default", state="RUNNING",
        reason="None", held=False, command=["python", "-c", "print('héllo ✓')", "--lr=3e-4", ""],
        script="#!/bin/bash\necho 'ü'\n", workdir="/tmp/wd", env={"A": "1", "EMPTY": "", "UNI": "日本"},
        output="out-%j.log", nodes_min=1, nodes_max=2, gpus_per_node=2, gpus=2, tasks_per_node=1,
        gpu_mem_mib=16384, time_limit_s=7200.5, checkpoint_interval_s=0.1 + 0.2,
        submit_time=1796040690.1428497, queued_since=1796040690.1428497, attempt=3, progress_s=1e-300,
        attained_gpu_s=1.2345678901234567e12, est_start=None, start_time=1796040691.000001, end_time=None,
        placement=placement, last_checkpoint=1796040999.75, exit_code=None, signal=None,
        stop_kind="requeue", stop_since=1796041000.5, stop_stage=2,
    )
    with store.session.begin() as s:
        row = JobRow(**values)
        s.add(row)
        s.flush()
        jid = row.id
    with store.session() as s:  # a new session reads it from the database, not from the identity map
        back = s.get(JobRow, jid)
        for k, v in values.items():
            got = getattr(back, k)
            assert got == v and type(got) is type(v), (k, got, v)


# -- configuration versions ------------------------------------------------------------------------

def test_config_versions_apply_diff_rollback(store: Store) -> None:
    v1_text = TWO_TEAMS.read_text()
    v2_text = v1_text.replace("nominal: 4, borrowing_limit: 4", "nominal: 6, borrowing_limit: 2", 1)
    assert v2_text != v1_text
    with store.session.begin() as s:
        assert config.apply(s, v1_text, ADMIN, "first") == 1
    with store.session.begin() as s:
        assert config.apply(s, v2_text, ADMIN, "more for vision") == 2
    with store.session.begin() as s:
        assert config.apply(s, v2_text, ADMIN) == 2  # the same text again: no new version
    with store.session() as s:
        d = config.diff(s, 1, 2)
        assert "-      default: {nominal: 4, borrowing_limit: 4}" in d
        assert "+      default: {nominal: 6, borrowing_limit: 2}" in d
        assert d.startswith("--- version 1\n+++ version 2\n")
        assert config.diff(s, 2, 2) == ""
        assert config.ConfigCache().current(s).spec.teams[0].quotas["default"].nominal == 6
    with store.session.begin() as s:
        assert config.rollback(s, 1, Principal("olga", "admin")) == 3
    with store.session() as s:
        v3 = config.get_version(s)
        assert (v3.version, v3.text, v3.author, v3.message) == (3, v1_text, "olga", "rollback to version 1")
        assert [h["version"] for h in config.history(s)] == [3, 2, 1]
        assert config.ConfigCache().current(s).spec.teams[0].quotas["default"].nominal == 4
        kinds = s.scalars(select(EventRow.kind).order_by(EventRow.id)).all()
        assert [k for k in kinds if k != "quota.changed"] == ["config.applied"] * 3
        assert "quota.changed" in kinds  # the audit trail's before/after of each team's quota (issue 18)
        with pytest.raises(NotFound):
            config.get_version(s, 99)
    # refused and invalid changes write nothing
    events = count(store, EventRow)
    with pytest.raises(Forbidden), store.session.begin() as s:
        config.apply(s, v2_text, Principal("olga", "operator"))
    with pytest.raises(ServiceError) as e, store.session.begin() as s:
        config.apply(s, v1_text.replace("default: {nominal: 4", "gpu-big: {nominal: 4", 1), ADMIN)
    assert "unknown pool 'gpu-big'" in e.value.message
    with pytest.raises(NotFound), store.session.begin() as s:
        config.rollback(s, 42, ADMIN)
    assert count(store, ConfigVersionRow) == 3 and count(store, EventRow) == events


# -- tokens ----------------------------------------------------------------------------------------

def _everything_stored(st: Store) -> str:
    """Every value of every row of every table, as text."""
    out = []
    with st.engine.connect() as c:
        for table in Base.metadata.sorted_tables:
            for row in c.execute(table.select()):
                out.append(" ".join(map(str, row)))
    return "\n".join(out)


def test_tokens_are_stored_as_hashes_only(store: Store, url: str) -> None:
    with_config(store)
    with store.session.begin() as s:
        token = auth.create_token(s, user="alice", role="member", team="vision", by=ADMIN, known_teams={"vision"})
        job_token = auth.create_token(s, user="job-7", role="job", team="vision", by=auth.SYSTEM, job_id=7)
    stored = _everything_stored(store)
    for t in (token, job_token):
        assert t not in stored and t.removeprefix("ty_") not in stored
        assert auth.hash_token(t) in stored
    with store.session() as s:
        hashes = s.scalars(select(TokenRow.token_hash)).all()
        assert auth.hash_token(token) in hashes and all(len(h) == 64 for h in hashes)
        assert auth.authenticate(s, token) == Principal("alice", "member", "vision")
        assert auth.authenticate(s, job_token) == Principal("job-7", "job", "vision", 7)
        with pytest.raises(Unauthorized):  # a stolen hash is no token
            auth.authenticate(s, auth.hash_token(token))
    if url.startswith("sqlite"):  # nor in the files, free pages and WAL included
        db = Path(url.removeprefix("sqlite:///"))
        raw = b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*"))
        assert auth.hash_token(token).encode() in raw
        assert token.encode() not in raw and token.removeprefix("ty_").encode() not in raw


# -- transactions ----------------------------------------------------------------------------------

def test_failed_submit_leaves_no_job_and_no_event(store: Store, tmp_path: Path) -> None:
    cfg = with_config(store)
    events = count(store, EventRow)
    with pytest.raises(ServiceError) as e, store.session.begin() as s:
        jobs.submit(s, jobs.JobSubmit(command=["x"], team="robotics"), ADMIN, cfg, tmp_path)
    assert e.value.field == "team"
    # a failure after the row was flushed (it has an id) and its event recorded rolls back too
    with pytest.raises(RuntimeError), store.session.begin() as s:
        row = jobs.submit(s, jobs.JobSubmit(command=["x"], team="vision"), ADMIN, cfg, tmp_path)
        assert row.id is not None
        raise RuntimeError("the request fails later in the same transaction")
    assert count(store, JobRow) == 0
    assert count(store, EventRow) == events
    with store.session.begin() as s:
        ok = jobs.submit(s, jobs.JobSubmit(command=["x"], team="vision"), ADMIN, cfg, tmp_path)
    assert count(store, JobRow) == 1 and count(store, EventRow) == events + 1
    assert ok.id is not None


def test_concurrent_submits_from_threads_all_land_with_distinct_ids(store: Store, tmp_path: Path) -> None:
    """Several writers at once, with no lock around them (the API holds one; the store must not need it)."""
    with_config(store)
    cache = config.ConfigCache()
    ids: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def writer(k: int) -> None:
        me = Principal(f"user{k}", "member", "nlp" if k % 2 else "vision")
        start.wait()
        for _ in range(15):
            try:
                with store.session.begin() as s:
                    row = jobs.submit(s, jobs.JobSubmit(command=["x"], name=f"w{k}"), me, cache.current(s), tmp_path)
                    s.flush()
                    ids.append(row.id)
            except BaseException as e:  # noqa: BLE001 (reported below)
                errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[:3]
    assert len(ids) == 90 and len(set(ids)) == 90
    with store.session() as s:
        assert sorted(s.scalars(select(JobRow.id)).all()) == sorted(ids)
        assert s.scalar(select(func.count()).select_from(EventRow).where(EventRow.kind == "job.submitted")) == 90


def test_concurrent_api_submits_on_sqlite(tmp_path: Path) -> None:
    """The same through the API (TestClient per thread), the control loop running alongside."""
    p = Plane(tmp_path)
    try:
        tokens = {t: p.token(f"u-{t}", "member", t) for t in ("vision", "nlp")}
        ids: list[int] = []
        errors: list[str] = []

        def client(team: str) -> None:
            c = p.client(tokens[team])
            for i in range(10):
                r = c.post("/api/v1/jobs", json={"command": script("pass"), "hold": True, "name": f"{team}{i}"})
                if r.status_code != 201:
                    errors.append(r.text)
                else:
                    ids.append(r.json()["id"])

        threads = [threading.Thread(target=client, args=(t,)) for t in ("vision", "nlp") * 3]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors[:3]
        assert len(ids) == 60 and len(set(ids)) == 60
        listed = [j["id"] for j in p.admin.get("/api/v1/jobs").json()["jobs"]]
        assert sorted(listed) == sorted(ids)
    finally:
        p.stop()


# -- a whole control plane on PostgreSQL ------------------------------------------------------------

def test_plane_end_to_end_on_postgresql(tmp_path: Path, pg_url: str) -> None:
    p = Plane(tmp_path, db_url=pg_url)
    try:
        alice = p.as_user("alice", "member", "vision")
        j = p.submit(alice, command=script("import os; print('hello from', os.environ['TRAINYARD_JOB_ID'])"), gpus=2)
        done = p.wait(j["id"], "COMPLETED")
        assert done["exit_code"] == 0 and len(done["placement"][0]["gpus"]) == 2
        assert f"hello from {j['id']}" in alice.get(f"/api/v1/jobs/{j['id']}/logs").text
        held = p.submit(alice, command=script("pass"), hold=True)
        assert alice.post(f"/api/v1/jobs/{held['id']}/cancel").json()["state"] == "CANCELLED"
        kinds = [e["kind"] for e in alice.get(f"/api/v1/jobs/{j['id']}/events").json()["events"]]
        assert kinds[0] == "job.submitted" and "job.started" in kinds
    finally:
        p.stop()
    # what the API answered is what PostgreSQL holds
    st = open_store(pg_url)
    try:
        assert st.engine.dialect.name == "postgresql"
        with st.session() as s:
            row = s.get(JobRow, j["id"])
            assert (row.state, row.exit_code, row.user, row.team) == ("COMPLETED", 0, "alice", "vision")
            assert s.get(JobRow, held["id"]).state == "CANCELLED"
            assert s.scalar(select(func.count()).select_from(TokenRow).where(TokenRow.role == "job")) == 1
    finally:
        st.close()
