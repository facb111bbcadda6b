"""Data where the job is (issue 41).

- jobs.datasets: the datasets a job asked for, pinned at submit (version, checksum, source);
- datasets: the dataset versions members added (`yard dataset add`);
- node_datasets: what the plane knows of each node's dataset cache;
- checkpoint_copies: each committed checkpoint of a job per tier (fast, archive);
- checkpoint_keeps: the checkpoints marked `keep`.

Revision ID: 0017
Revises: 0016
"""
import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("datasets", sa.JSON(), nullable=True))
    op.create_table(
        "datasets",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("team", sa.String(100), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("checksum", sa.String(71), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("grants", sa.JSON(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("added_by", sa.String(100), nullable=False),
        sa.Column("added_at", sa.Float(), nullable=False),
        sa.Column("reader", sa.JSON(), nullable=True),
    )
    op.create_index("ux_datasets_name_version", "datasets", ["name", "version"], unique=True)
    op.create_table(
        "node_datasets",
        sa.Column("node", sa.String(100), primary_key=True),
        sa.Column("checksum", sa.String(71), primary_key=True),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("staged_at", sa.Float(), nullable=False),
        sa.Column("last_used_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "checkpoint_copies",
        sa.Column("job_id", sa.Integer(), primary_key=True),
        sa.Column("step", sa.Integer(), primary_key=True),
        sa.Column("tier", sa.String(10), primary_key=True),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("location", sa.Text(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=True),
    )
    op.create_table(
        "checkpoint_keeps",
        sa.Column("job_id", sa.Integer(), primary_key=True),
        sa.Column("step", sa.Integer(), primary_key=True),
        sa.Column("by", sa.String(100), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("checkpoint_keeps")
    op.drop_table("checkpoint_copies")
    op.drop_table("node_datasets")
    op.drop_index("ux_datasets_name_version", table_name="datasets")
    op.drop_table("datasets")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("datasets")
