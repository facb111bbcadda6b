"""retries with backoff, lost work and recovery accounting

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.add_column(sa.Column("retries", sa.Integer(), nullable=False, server_default="0"))
        b.add_column(sa.Column("retry_after", sa.Float(), nullable=True))
        b.add_column(sa.Column("lost_gpu_s", sa.Float(), nullable=False, server_default="0"))
    with op.batch_alter_table("attempts") as b:
        b.add_column(sa.Column("cause", sa.String(length=20), nullable=False, server_default=""))
        b.add_column(sa.Column("lost_gpu_s", sa.Float(), nullable=False, server_default="0"))
        b.add_column(sa.Column("first_step_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as b:
        b.drop_column("first_step_at")
        b.drop_column("lost_gpu_s")
        b.drop_column("cause")
    with op.batch_alter_table("jobs") as b:
        b.drop_column("lost_gpu_s")
        b.drop_column("retry_after")
        b.drop_column("retries")
