"""Edits of the stored configuration text that change only what they are asked to.

The configuration is versioned text: `yard cluster get` shows it, `diff` compares it, and its
comments are where operators say why a quota is what it is. A team update used to load the text,
change the team and dump it again, which dropped every comment, reflowed every mapping and, with
the CLI sending whole quotas, a borrowing limit nobody had named. Here the text is edited
through ruamel.yaml's round trip (comments, order, flow or block style and quoting kept) and
only the keys given change. The result is checked to load as exactly the intended data (PyYAML,
as the plane reads it); a layout the round trip cannot follow is dumped afresh instead, which
keeps the data but not the comments.
"""

from __future__ import annotations

import copy
from typing import Any

from trainyard.services import yaml_edit
from trainyard.services.errors import NotFound

UNSET: Any = object()  # a field the update does not name


def edit_team(text: str, name: str, *, cohort: Any = UNSET,
              quotas: dict[str, dict[str, Any] | None] | None = None, replace: bool = False) -> str:
    """`text` with team `name` changed.

    `cohort`: the new cohort ("" or None: none), or UNSET to leave it. `quotas`: per pool, the
    fields to set (a None value removes that limit), or None to remove the pool's quota. With
    `replace` (PUT), the pools given are the team's whole quotas and each one's fields the whole
    quota; otherwise (PATCH) only the pools and fields given change.

    Raises:
        NotFound: no team of that name.
    """
    return yaml_edit.edited(text, lambda doc: _apply(_team(doc, name), cohort, copy.deepcopy(quotas), replace))


def _team(doc: Any, name: str) -> Any:
    for t in (doc.get("teams") or []) if isinstance(doc, dict) else []:
        if isinstance(t, dict) and t.get("name") == name:
            return t
    raise NotFound(f"no team {name!r}")


def _apply(team: Any, cohort: Any, quotas: dict[str, dict[str, Any] | None] | None, replace: bool) -> None:
    """The change itself, on either PyYAML's plain data or ruamel's commented data (same interface)."""
    if cohort is not UNSET:
        if cohort:
            team["cohort"] = cohort
        else:
            team.pop("cohort", None)
    if quotas is None:
        return
    if "quotas" not in team or not isinstance(team["quotas"], dict):
        team["quotas"] = {}
    current = team["quotas"]
    if replace:
        for pool in [p for p in current if p not in quotas]:
            del current[pool]
    for pool, fields in quotas.items():
        if fields is None:
            current.pop(pool, None)
            continue
        if pool not in current or not isinstance(current[pool], dict):
            current[pool] = {}
        q = current[pool]
        if replace:
            for k in [k for k in q if k not in fields or fields[k] is None]:
                del q[k]
        for k, v in fields.items():
            if v is None:
                q.pop(k, None)
            else:
                q[k] = v
