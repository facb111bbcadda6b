"""Which store this is: an id made once, when the store is created (Alembic 0007), kept in
`store_meta`.

A backup of the database carries the same id (it is the same store, at an earlier time); a new
database on an old data dir has another. Job directories name the store that made them
(`control/jobfiles/claim.py`), and the start-up audit (`control/lifecycle/store_audit.py`) compares the id with
the one the data dir last saw, so that a data dir used with another store is told apart from a
store that merely lost its newest transactions.
"""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from trainyard.store.models import StoreMetaRow

INSTANCE_ID = "instance_id"


def instance_id(s: Session) -> str:
    """The store's id ("" in a store whose `store_meta` row was removed by hand, until the next
    start makes one: `ensure_instance_id`)."""
    row = s.get(StoreMetaRow, INSTANCE_ID)
    return row.value if row is not None else ""


def ensure_instance_id(s: Session) -> str:
    """The store's id, made now if the row is missing (called at start, in a write transaction)."""
    row = s.get(StoreMetaRow, INSTANCE_ID)
    if row is None:
        row = StoreMetaRow(key=INSTANCE_ID, value=uuid.uuid4().hex)
        s.add(row)
    return row.value
