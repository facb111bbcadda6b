"""Helpers shared by the API tests: a snapshot of what the store holds, to prove a refused or
rejected request changed nothing."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from trainyard.store.models import ConfigVersionRow, EventRow, JobRow, NodeRow, TokenRow


def store_snapshot(p: Any) -> dict[str, Any]:
    """Everything a user action could change: jobs (state, hold, pending stop), events, config
    versions, tokens, node states."""
    with p.cp.store.session() as s:
        return {
            "jobs": sorted(s.execute(select(JobRow.id, JobRow.state, JobRow.held, JobRow.reason, JobRow.stop_kind,
                                            JobRow.team)).all()),
            "events": s.scalar(select(func.count(EventRow.id))),
            "last_event": s.scalar(select(func.max(EventRow.id))),
            "configs": s.scalar(select(func.count(ConfigVersionRow.version))),
            "tokens": s.scalar(select(func.count(TokenRow.id))),
            "nodes": sorted(s.execute(select(NodeRow.name, NodeRow.state, NodeRow.reason)).all()),
        }


def job_count(p: Any) -> int:
    with p.cp.store.session() as s:
        return s.scalar(select(func.count(JobRow.id)))
