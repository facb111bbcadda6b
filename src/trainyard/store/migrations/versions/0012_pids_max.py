"""jobs.pids_max: the pids limit per node the job's latest attempt was launched with (the
configuration's `teams[].pids_max`, else `classes[].pids_max`, else the built-in default;
control/loop/attempt_start.py), as `yard show` reports it (PidsLimit=).

Revision ID: 0012
Revises: 0011
"""
import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("pids_max", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("pids_max")
