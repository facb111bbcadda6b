"""jobs.interactive: an interactive allocation's record (issue 38: `yard alloc`, `yard srun --pty`,
`yard notebook`).

JSON: {"kind": "alloc" | "srun" | "notebook", …, "exit": the session's exit code once its end
ended the allocation}; NULL for every other job.

Revision ID: 0014
Revises: 0013
"""
import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("interactive", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "interactive")  # plain DROP COLUMN: see 0013
