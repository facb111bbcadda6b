"""jobs.notice_signal and jobs.notice_sent_attempt: sbatch's --signal, the notice a job asked for
before its time limit, and the attempt it was last sent to, so a restarted loop does not send it
twice (control/loop/stops.py).

Revision ID: 0010
Revises: 0009
"""
import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("notice_signal", sa.String(), nullable=True))
        batch_op.add_column(sa.Column("notice_sent_attempt", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("notice_sent_attempt")
        batch_op.drop_column("notice_signal")
