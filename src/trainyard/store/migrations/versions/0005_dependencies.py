"""jobs.dependency, jobs.dependency_pending, jobs.eligible_time, jobs.begin_time: `--dependency`
and `--begin` as Slurm takes them, and the time a job became free to run (Slurm's EligibleTime)

Revision ID: 0005
Revises: 0004
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.add_column(sa.Column("dependency", sa.Text(), nullable=True))
        b.add_column(sa.Column("dependency_pending", sa.Boolean(), nullable=False, server_default=sa.false()))
        b.add_column(sa.Column("eligible_time", sa.Float(), nullable=True))
        b.add_column(sa.Column("begin_time", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.drop_column("begin_time")
        b.drop_column("eligible_time")
        b.drop_column("dependency_pending")
        b.drop_column("dependency")
