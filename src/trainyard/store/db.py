"""Opening the store: SQLite (WAL, the embedded default) or PostgreSQL, migrated to the newest schema.

`open_store(url)` returns a `Store`: a SQLAlchemy engine plus a session factory. The schema is
always brought up to date by Alembic on open (`migrations/`), so an older data dir keeps working
after an upgrade and no code path creates tables behind Alembic's back.

SQLite is tuned for a control plane that writes small transactions often: WAL (readers never
block the writer), `synchronous=NORMAL` (durable across process crashes, which is what `kill -9`
of the control plane tests), a busy timeout so that the API and the control loop can share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).parent / "migrations"
BUSY_TIMEOUT_MS = 10_000  # how long a SQLite writer waits for the one write lock
DEFAULT_POOL = 8  # connections of a store nobody sized (tools, tests); the plane sizes its own
POOL_TIMEOUT_S = 10.0  # a pool sized from its threads never waits this long; if it does, say so


def sqlite_url(data_dir: str | Path) -> str:
    return f"sqlite:///{Path(data_dir).resolve() / 'trainyard.db'}"


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # noqa: ANN001 (DB-API objects)
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(url: str, pool_size: int = DEFAULT_POOL) -> Engine:
    """An engine whose pool holds `pool_size` connections and never more: the caller sizes it from
    the threads that use it (see `open_store`), so a request never waits for a connection (with
    SQLAlchemy's default of 5 + 10, 60 concurrent API requests waited 30 s each for one and failed)."""
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000},
                               pool_size=pool_size, max_overflow=0, pool_timeout=POOL_TIMEOUT_S)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=pool_size, max_overflow=0, pool_timeout=POOL_TIMEOUT_S)


def migrate(engine: Engine) -> None:
    """Bring the schema to Alembic's head (creates it on an empty database)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


@dataclass
class Store:
    engine: Engine
    session: sessionmaker[Session]
    url: str

    def close(self) -> None:
        self.engine.dispose()

    def writable(self, timeout_s: float = 2.0) -> tuple[bool, str]:
        """Can a transaction write now? (ok, why not).

        SQLite: a real write and commit of nothing that matters (the header's `user_version`,
        set to the value it has; Alembic does not use it), because taking the write lock alone
        succeeds on a file that then fails at commit (a read-only or full file system, an
        immutable file); a lock held longer than `timeout_s` also says no. PostgreSQL: not a
        read-only standby nor read-only by default."""
        try:
            with self.engine.connect() as c:
                if self.engine.dialect.name == "sqlite":
                    raw = c.connection.driver_connection
                    if raw is None:  # typed optional: a connection invalidated meanwhile
                        return False, "the store cannot take writes: its connection was invalidated"
                    raw.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
                    try:
                        raw.execute("BEGIN IMMEDIATE")
                        try:
                            version = raw.execute("PRAGMA user_version").fetchone()[0]
                            raw.execute(f"PRAGMA user_version={int(version)}")
                            raw.execute("COMMIT")
                        except BaseException:
                            raw.execute("ROLLBACK")
                            raise
                    finally:
                        raw.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
                    return True, "the store takes writes"
                ro = c.exec_driver_sql("SELECT pg_is_in_recovery(), current_setting('transaction_read_only')").one()
                if ro[0]:
                    return False, "the store is a read-only standby (in recovery)"
                if ro[1] == "on":
                    return False, "the store's transactions are read-only (default_transaction_read_only)"
                return True, "the store takes writes"
        except Exception as e:  # noqa: BLE001 - any failure means "cannot write": say which
            return False, f"the store cannot take writes: {type(e).__name__}: {e}"


def open_store(url: str, pool_size: int = DEFAULT_POOL, *, migrated: bool = False) -> Store:
    """The store at `url`, migrated to the newest schema (unless `migrated`: a second pool on a
    store already opened, such as the control loop's own)."""
    engine = make_engine(url, pool_size)
    if not migrated:
        migrate(engine)
    return Store(engine, sessionmaker(engine, expire_on_commit=False), url)
