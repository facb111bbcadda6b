"""The rest of sbatch's options a job keeps (issue 17 item 3), in one migration so that the parts
landing them (placement constraints, reservations, mail, stderr) share one schema step:

- where it may run: `constraint` (-C/--constraint, node features with & and |), `gpu_model`
  (the TYPE of --gpus/--gres=gpu:TYPE:N), `nodelist` / `exclude_nodes` (-w / -x, node names),
  `exclusive` (--exclusive: whole nodes), `ntasks` (-n/--ntasks as given);
- `reservation` (--reservation: the admin reservation it runs in);
- `mail_type` / `mail_user` (--mail-type/--mail-user: the events the cluster's webhook reports);
- `error` / `open_mode` (-e/--error: stderr apart; --open-mode=append|truncate).

Revision ID: 0011
Revises: 0010
"""
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

COLUMNS: list[tuple[str, sa.types.TypeEngine[Any]]] = [
    ("constraint", sa.Text()), ("gpu_model", sa.String(100)), ("nodelist", sa.JSON()),
    ("exclude_nodes", sa.JSON()), ("ntasks", sa.Integer()), ("reservation", sa.String(100)),
    ("mail_type", sa.String(200)), ("mail_user", sa.String(200)), ("error", sa.String(1000)),
    ("open_mode", sa.String(10)),
]


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        for name, kind in COLUMNS:
            batch_op.add_column(sa.Column(name, kind, nullable=True))
        batch_op.add_column(sa.Column("exclusive", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("exclusive")
        for name, _ in reversed(COLUMNS):
            batch_op.drop_column(name)
