"""The store's identity and job directories a restored store cannot repeat (issue 16):
`store_meta` (one row per fact; `instance_id`, made once with the store), `jobs.dir_key` (a random
key per job: its directory is `jobs/<id>-<key>`; NULL for jobs stored before, which keep
`jobs/<id>`), and an index on (user, state) for counting a user's pending and running jobs
against `limits.max_submit_jobs`.

Revision ID: 0007
Revises: 0006
"""
import time
import uuid

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    meta = op.create_table(
        "store_meta",
        sa.Column("key", sa.String(length=50), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    # Made here, once: a copy of the database (a backup) carries the same id, a new store another.
    op.bulk_insert(meta, [{"key": "instance_id", "value": uuid.uuid4().hex},
                          {"key": "created_at", "value": repr(time.time())}])
    with op.batch_alter_table("jobs") as b:
        b.add_column(sa.Column("dir_key", sa.String(length=32), nullable=True))
        b.create_index("ix_jobs_user_state", ["user", "state"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.drop_index("ix_jobs_user_state")
        b.drop_column("dir_key")
    op.drop_table("store_meta")
