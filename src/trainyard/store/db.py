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


def sqlite_url(data_dir: str | Path) -> str:
    return f"sqlite:///{Path(data_dir).resolve() / 'trainyard.db'}"


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # noqa: ANN001 (DB-API objects)
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(url: str) -> Engine:
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 10})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


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


def open_store(url: str) -> Store:
    engine = make_engine(url)
    migrate(engine)
    return Store(engine, sessionmaker(engine, expire_on_commit=False), url)
