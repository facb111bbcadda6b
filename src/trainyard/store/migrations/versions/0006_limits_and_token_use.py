"""Host resource requests (jobs.mem_mib, mem_per_gpu_mib, cpus_per_task: sbatch's --mem,
--mem-per-gpu, --cpus-per-task) and when a token was last used (tokens.last_used_at)

Revision ID: 0006
Revises: 0005
"""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.add_column(sa.Column("mem_mib", sa.Integer(), nullable=True))
        b.add_column(sa.Column("mem_per_gpu_mib", sa.Integer(), nullable=True))
        b.add_column(sa.Column("cpus_per_task", sa.Integer(), nullable=True))
    with op.batch_alter_table("tokens") as b:
        b.add_column(sa.Column("last_used_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tokens") as b:
        b.drop_column("last_used_at")
    with op.batch_alter_table("jobs") as b:
        b.drop_column("cpus_per_task")
        b.drop_column("mem_per_gpu_mib")
        b.drop_column("mem_mib")
