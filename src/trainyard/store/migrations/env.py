"""Alembic environment: runs on the connection `trainyard.store.db.migrate` hands over.

To write a new migration after changing `models.py`:
    .venv/bin/alembic -c src/trainyard/store/migrations/alembic.ini revision --autogenerate -m "what"
with `sqlalchemy.url` pointing at a database migrated to the current head.
"""

from alembic import context
from sqlalchemy import create_engine

from trainyard.store.models import Base

config = context.config
target_metadata = Base.metadata

conn = config.attributes.get("connection")
if conn is not None:
    context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
else:  # the alembic command line, for writing migrations
    url = config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("the alembic configuration names no sqlalchemy.url")
    engine = create_engine(url)
    with engine.connect() as c:
        context.configure(connection=c, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
