"""Nodes: their shape comes from the configuration, their state (up, drain, down) from the store.

`drain` (Slurm's `scontrol update state=drain`) stops new work landing on a node; jobs already
there run to their end. `resume` returns it. Operators and admins may do both.

A node may also be *suspect* beside its state (issue 39): slow in two unrelated jobs, held out of
new work until its speed check judges it (control/loop/suspects.py). `suspect_since` and
`suspect_reason` say so in every node view; a person's `resume` ends the suspicion too (event
`node.suspect_cleared`), as it ends a drain.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.services.auth import Principal
from trainyard.services.config import ConfigVersion
from trainyard.services.errors import Forbidden, NotFound
from trainyard.services.events import record
from trainyard.states import ACTIVE_STATES
from trainyard.store.models import JobRow, NodeRow


def node_states(s: Session) -> dict[str, NodeRow]:
    return {r.name: r for r in s.scalars(select(NodeRow))}


def gpus_in_use(s: Session) -> dict[str, set[int]]:
    used: dict[str, set[int]] = {}
    for placement in s.scalars(select(JobRow.placement).where(JobRow.state.in_(ACTIVE_STATES))):
        for part in placement or []:
            used.setdefault(part["node"], set()).update(part["gpus"])
    return used


def list_nodes(s: Session, cfg: ConfigVersion, containment: str | None = None) -> list[dict[str, Any]]:
    """The configured nodes with their state and use; `containment`: how the backend contains each
    attempt's processes there (cgroup2, cgroup1, subreaper; slurm: its own step tracking)."""
    states, used = node_states(s), gpus_in_use(s)
    out = []
    for n in cfg.nodes:
        st = states.get(n.name)
        busy = len(used.get(n.name, ()))
        out.append({"name": n.name, "pool": n.pool, "gpus": n.gpus, "gpus_used": busy, "gpus_free": n.gpus - busy,
                    "gpu_model": n.gpu_model, "gpu_mem_gb": n.gpu_mem_mib / 1024, "block": n.block, "rack": n.rack,
                    "state": st.state if st else "up", "reason": st.reason if st else "",
                    "suspect_since": st.suspect_since if st else None, "suspect_reason": st.suspect_reason if st else ""})
        if containment is not None:
            out[-1]["containment"] = containment
    return out


def get_node(s: Session, cfg: ConfigVersion, name: str) -> dict[str, Any]:
    for n in list_nodes(s, cfg):
        if n["name"] == name:
            return n
    raise NotFound(f"no node {name!r}")


def set_state(s: Session, cfg: ConfigVersion, name: str, state: str, reason: str, by: Principal) -> dict[str, Any]:
    if by.role not in ("admin", "operator"):
        raise Forbidden("only an operator or admin can drain or resume nodes")
    get_node(s, cfg, name)
    row = s.get(NodeRow, name) or NodeRow(name=name)
    before = {"state": row.state or "up", "reason": row.reason or ""}
    row.state, row.reason, row.updated_at, row.updated_by = state, reason, time.time(), by.user
    s.add(row)
    verb = {"up": "resumed", "drain": "drained", "down": "marked down"}[state]
    record(s, by.user, f"node.{state}", f"node {name} {verb} by {by.user}" + (f": {reason}" if reason else ""),
           node=name, data={"state": state, "reason": reason, "before": before,
                            "after": {"state": state, "reason": reason}})
    if state == "up" and row.suspect_since is not None:
        row.suspect_since, row.suspect_reason = None, ""
        record(s, by.user, "node.suspect_cleared", f"node {name}: its straggler suspicion ended by {by.user}'s resume",
               node=name, data={"by": by.user})
    s.flush()
    return get_node(s, cfg, name)
