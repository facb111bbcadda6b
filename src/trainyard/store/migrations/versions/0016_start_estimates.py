"""Start-time estimates that are measured (issue 40, part 5).

- jobs.expected_runtime_s: the run time learned from the user's past jobs of the same name
  (services/learned_runtimes.py), at most the limit; the start estimates use it (sched/estimate.py);
  ix_jobs_user_name_state_end finds a user's newest completed jobs of a name at each submission;
- start_estimates: each waiting job's estimated start whenever it changed, per pending spell
  (`attempt`: the attempt it waits to start as), bounded per spell (services/estimates.py);
- estimate_outcomes: per started attempt that had an estimate, its first and last estimates and
  the error of each (actual start − estimate).

Revision ID: 0016
Revises: 0015
"""
import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("expected_runtime_s", sa.Float(), nullable=True))
    op.create_index("ix_jobs_user_name_state_end", "jobs", ["user", "name", "state", "end_time"])
    op.create_table(
        "start_estimates",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("est_start", sa.Float(), nullable=False),
    )
    op.create_index("ix_start_estimates_job", "start_estimates", ["job_id", "attempt", "id"])
    op.create_table(
        "estimate_outcomes",
        sa.Column("job_id", sa.Integer(), primary_key=True),
        sa.Column("attempt", sa.Integer(), primary_key=True),
        sa.Column("job_class", sa.String(100), nullable=False),
        sa.Column("team", sa.String(100), nullable=False),
        sa.Column("user", sa.String(100), nullable=False),
        sa.Column("queued_since", sa.Float(), nullable=False),
        sa.Column("first_at", sa.Float(), nullable=False),
        sa.Column("first_estimate", sa.Float(), nullable=False),
        sa.Column("last_at", sa.Float(), nullable=False),
        sa.Column("last_estimate", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("error_s", sa.Float(), nullable=False),
        sa.Column("last_error_s", sa.Float(), nullable=False),
        sa.Column("changes", sa.Integer(), nullable=False),
    )
    op.create_index("ix_estimate_outcomes_started_at", "estimate_outcomes", ["started_at"])


def downgrade() -> None:
    op.drop_index("ix_estimate_outcomes_started_at", table_name="estimate_outcomes")
    op.drop_table("estimate_outcomes")
    op.drop_index("ix_start_estimates_job", table_name="start_estimates")
    op.drop_table("start_estimates")
    op.drop_index("ix_jobs_user_name_state_end", table_name="jobs")
    op.drop_column("jobs", "expected_runtime_s")  # plain DROP COLUMN: see 0013
