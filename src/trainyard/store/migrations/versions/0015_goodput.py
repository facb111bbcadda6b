"""The goodput ledger, per-GPU telemetry and suspect nodes (issue 39).

- attempts.ledger: {bucket: GPU-seconds} (contracts.LEDGER_BUCKETS), set when the attempt ends;
- attempts.first_output_at: when the plane first saw the attempt's output (a bare job's startup end);
- attempts.gpu_summary: per GPU, mean and peak utilization, peak memory;
- nodes.suspect_since, nodes.suspect_reason: a node flagged as a straggler in unrelated jobs;
- gpu_samples: the per-GPU time series of each job, bounded per job.

Revision ID: 0015
Revises: 0014
"""
import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch_op:
        batch_op.add_column(sa.Column("ledger", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("first_output_at", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("gpu_summary", sa.JSON(), nullable=True))
    with op.batch_alter_table("nodes") as batch_op:
        batch_op.add_column(sa.Column("suspect_since", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("suspect_reason", sa.String(200), nullable=False, server_default=""))
    op.create_table(
        "gpu_samples",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(100), nullable=False),
        sa.Column("gpu", sa.Integer(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("period_s", sa.Float(), nullable=False),
        sa.Column("util", sa.Float(), nullable=False),
        sa.Column("util_peak", sa.Float(), nullable=False),
        sa.Column("mem_mib", sa.Float(), nullable=False),
        sa.Column("power_w", sa.Float(), nullable=True),
        sa.Column("temp_c", sa.Float(), nullable=True),
        sa.Column("source", sa.String(20), nullable=False),
    )
    op.create_index("ix_gpu_samples_job_time", "gpu_samples", ["job_id", "time"])


def downgrade() -> None:
    op.drop_index("ix_gpu_samples_job_time", table_name="gpu_samples")
    op.drop_table("gpu_samples")
    for table, cols in (("nodes", ("suspect_reason", "suspect_since")),
                        ("attempts", ("gpu_summary", "first_output_at", "ledger"))):
        for col in cols:
            op.drop_column(table, col)  # plain DROP COLUMN: see 0013
