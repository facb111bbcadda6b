"""The audit export (`yard audit`, `GET /api/v1/audit`): every change to the cluster, who made it,
when, and what it was before and after, as JSON lines.

The changes are events of these kinds (`AUDIT_KINDS`), each with `actor` and `time`, and
`data.before` / `data.after` where a value changed:
- `config.applied` (the version before and after) and `quota.changed` (a team's cohort and
  quotas per pool, before and after; none before: a new team); the pilot pool's steps, each also
  a version: `pilot.applied`, `pilot.promoted`, `pilot.rolled_back` (services/pilot.py);
- `token.created`, `token.revoked`;
- a person's action on a job: `job.submitted`, `job.cancelled` (while waiting) and
  `job.cancel_requested` (running), `job.held`, `job.released`, `job.requeued` and
  `job.requeue_requested` (state, hold and reason before and after);
- node state: `node.drain`, `node.up`, `node.down` (by an operator, or by the health checks:
  `actor` says which), `node.suspect`, `node.remediating`, `node.remediated`,
  `node.remediation_failed`;
- `retention.purged`: what a purge removed; `retention.deleted`: one job's logs or job dir that a
  lifecycle rule deleted (job, what, bytes, rule: services/retention.py).

Retention never deletes these (services/retention.py): the audit trail outlives the jobs it
names. Admins and operators read it; other roles are refused (it names every user and token).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.services.accounting import MAX_PAGE, Window
from trainyard.services.auth import Principal
from trainyard.services.errors import Forbidden
from trainyard.store.models import EventRow

AUDIT_KINDS: tuple[str, ...] = (
    "config.applied", "quota.changed", "pilot.applied", "pilot.promoted", "pilot.rolled_back",
    "token.created", "token.revoked",
    "job.submitted", "job.cancelled", "job.cancel_requested", "job.held", "job.released", "job.requeued",
    "job.requeue_requested",
    "node.drain", "node.up", "node.down", "node.suspect", "node.remediating", "node.remediated",
    "node.remediation_failed",
    "retention.purged", "retention.deleted",
)


class AuditEvent(BaseModel):
    id: int
    time: float
    actor: str
    kind: str
    job_id: int | None
    node: str | None
    message: str
    data: dict[str, Any] = Field(description="the change's details; `before` and `after` where a value changed")


class AuditPage(BaseModel):
    events: list[AuditEvent]
    next_after: int | None = Field(description="pass as `after` for the next page; null: this was the last")


def page(s: Session, by: Principal, win: Window, *, kinds: tuple[str, ...] = (), actors: tuple[str, ...] = (),
         after: int = 0, limit: int = 1000) -> AuditPage:
    """Audit events in [win.start, win.end), oldest first, above the cursor `after` (an event id).

    Raises:
        Forbidden: not an admin or operator. ServiceError: an unknown kind (field `kind`).
    """
    from trainyard.services.errors import ServiceError

    if by.role not in ("admin", "operator"):
        raise Forbidden("only admins and operators read the audit trail")
    bad = [k for k in kinds if k not in AUDIT_KINDS]
    if bad:
        raise ServiceError(f"kind: {bad[0]!r} is not an audited kind; kinds are {', '.join(AUDIT_KINDS)}",
                           field="kind")
    n = max(1, min(limit, MAX_PAGE))
    q = (select(EventRow).where(EventRow.id > after, EventRow.kind.in_(kinds or AUDIT_KINDS),
                                EventRow.time >= win.start, EventRow.time < win.end))
    if actors:
        q = q.where(EventRow.actor.in_(actors))
    rows = list(s.scalars(q.order_by(EventRow.id).limit(n)))
    return AuditPage(events=[AuditEvent(id=e.id, time=e.time, actor=e.actor, kind=e.kind, job_id=e.job_id,
                                        node=e.node, message=e.message, data=e.data or {}) for e in rows],
                     next_after=rows[-1].id if len(rows) == n else None)
