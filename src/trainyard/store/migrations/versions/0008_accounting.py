"""Accounting (issue 18): each attempt's GPU count (attempts.gpus, filled from its placement), the
peak memory the runtime reported for it (attempts.max_rss_mib, peak_gpu_mem_mib), indexes for
time-window reads (attempts.started_at, attempts.ended_at, jobs.end_time, events.kind), and
`usage_carry`: what purged rows had added to the Prometheus counters (retention).

Revision ID: 0008
Revises: 0007
"""
import json

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as b:
        b.add_column(sa.Column("gpus", sa.Integer(), nullable=False, server_default="0"))
        b.add_column(sa.Column("max_rss_mib", sa.Float(), nullable=True))
        b.add_column(sa.Column("peak_gpu_mem_mib", sa.Float(), nullable=True))
    # Existing attempts: the GPUs their placement held, as the loop counts them (one per GPU index).
    conn = op.get_bind()
    attempts = sa.table("attempts", sa.column("id", sa.Integer), sa.column("placement", sa.Text),
                        sa.column("gpus", sa.Integer))
    rows = conn.execute(sa.select(attempts.c.id, sa.cast(attempts.c.placement, sa.Text))).all()
    updates = []
    for aid, text in rows:
        try:
            placement = json.loads(text) if text else []
            gpus = sum(len(p.get("gpus") or ()) for p in placement or [])
        except (ValueError, TypeError, AttributeError):
            gpus = 0
        if gpus:
            updates.append({"aid": aid, "g": gpus})
    if updates:
        conn.execute(attempts.update().where(attempts.c.id == sa.bindparam("aid")).values(gpus=sa.bindparam("g")),
                     updates)
    op.create_index("ix_attempts_started_at", "attempts", ["started_at"])
    op.create_index("ix_attempts_ended_at", "attempts", ["ended_at"])
    op.create_index("ix_jobs_end_time", "jobs", ["end_time"])
    op.create_index("ix_events_kind_time", "events", ["kind", "time"])
    op.create_table(
        "usage_carry",
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("labels", sa.String(length=500), nullable=False),
        sa.Column("value", sa.Float(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("name", "labels"),
    )


def downgrade() -> None:
    op.drop_table("usage_carry")
    op.drop_index("ix_events_kind_time", table_name="events")
    op.drop_index("ix_jobs_end_time", table_name="jobs")
    op.drop_index("ix_attempts_ended_at", table_name="attempts")
    op.drop_index("ix_attempts_started_at", table_name="attempts")
    with op.batch_alter_table("attempts") as b:
        b.drop_column("peak_gpu_mem_mib")
        b.drop_column("max_rss_mib")
        b.drop_column("gpus")
