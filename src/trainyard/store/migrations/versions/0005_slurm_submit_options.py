"""Slurm's submission options: `--dependency` (jobs.dependency, dependency_pending), `--begin`
(begin_time), `--array` (array_job_id, array_task_id, array_throttle), and the time a job became
free to run (eligible_time, Slurm's EligibleTime)

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
        b.add_column(sa.Column("array_job_id", sa.Integer(), nullable=True))
        b.add_column(sa.Column("array_task_id", sa.Integer(), nullable=True))
        b.add_column(sa.Column("array_throttle", sa.Integer(), nullable=True))
        b.create_index("ix_jobs_array_job_id", ["array_job_id"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.drop_index("ix_jobs_array_job_id")
        b.drop_column("array_throttle")
        b.drop_column("array_task_id")
        b.drop_column("array_job_id")
        b.drop_column("begin_time")
        b.drop_column("eligible_time")
        b.drop_column("dependency_pending")
        b.drop_column("dependency")
