"""jobs.container, jobs.image_digest and attempts.image_digest: a job's environment image (issue 37).

`jobs.container` is the job's `spec.container.ContainerOptions` as its JSON record (`to_record()`;
NULL: a bare job, run in the node's own environment); `jobs.image_digest` the manifest digest its
first attempt resolved and pinned (every later attempt and every node of a gang runs it);
`attempts.image_digest` the digest that attempt ran (NULL: bare).

Revision ID: 0013
Revises: 0012
"""
import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("container", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("image_digest", sa.String(length=71), nullable=True))
    with op.batch_alter_table("attempts") as batch_op:
        batch_op.add_column(sa.Column("image_digest", sa.String(length=71), nullable=True))


def downgrade() -> None:
    # Plain ALTER TABLE ... DROP COLUMN (SQLite has it since 3.35): a batch operation would copy
    # `jobs` and drop the original, which SQLite refuses while `attempts` rows reference it
    # (foreign keys are on: store/db.py).
    op.drop_column("attempts", "image_digest")
    op.drop_column("jobs", "image_digest")
    op.drop_column("jobs", "container")
