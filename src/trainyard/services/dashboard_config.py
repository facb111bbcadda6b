"""The dashboard's configuration page (`/ui/config`): the configuration in force, its versions and
a diff, the pilot pool's trial, and a what-if's figures as table rows.

Each part is what the API answers for the same caller (`GET /api/v1/cluster/config`, `/versions`,
`/diff`, `GET /api/v1/cluster/pilot/status`, `POST /api/v1/cluster/config/what-if`): this module
calls the same services, so the page and the API never disagree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from sqlalchemy.orm import Session

from trainyard.services import config, pilot_status
from trainyard.services.config import ConfigVersion

# (figure, how it is shown): one row per team or class and figure, in this order (as `yard
# cluster apply --what-if` prints them: cli/whatif.py).
FIGURES = (("mean_wait_s", "s"), ("p99_wait_s", "s"), ("mean_jct_s", "s"), ("gpu_share", "share"),
           ("quota_share", "share"), ("preemptions", "n"), ("lost_gpu_hours", "h"), ("busy_gpu_hours", "h"))
# The whole cluster's figures (the simulator's metrics, sim/result.py).
OVERALL = (("avg_wait_s", "s"), ("p99_wait_s", "s"), ("avg_jct_s", "s"), ("utilization", "share"),
           ("preemptions", "n"), ("lost_gpu_hours", "h"))


class WhatIfRow(TypedDict):
    """One line of the side-by-side table: the group (`all jobs`, `team X`, `class Y`), the
    figure, its kind (s, share, n, h: how the template shows it), and the three numbers."""
    group: str
    figure: str
    kind: str
    in_force: float | None
    proposed: float | None
    delta: float | None


def page(s: Session, cfg: ConfigVersion, now: float, data_dir: Path | None, diff_from: int | None) -> dict[str, Any]:
    """The page's data: the version in force, the history (newest first), the diff from
    `diff_from` to the version in force (None: no diff asked), and the pilot's status.

    Raises:
        NotFound: `diff_from` names no stored version (as `GET /diff`).
    """
    diff = None
    if diff_from is not None:
        diff = {"from": diff_from, "to": cfg.version, "text": config.diff(s, diff_from, cfg.version)}
    return {"current": {"version": cfg.version, "text": cfg.text, "author": cfg.author,
                        "created_at": cfg.created_at, "message": cfg.message},
            "versions": config.history(s), "diff": diff,
            "pilot": pilot_status.status(s, cfg, now, data_dir)}


def what_if_rows(doc: dict[str, Any]) -> list[WhatIfRow]:
    """The what-if's answer (`services/whatif.py`) as rows: the whole cluster's figures, then each
    team's and each class's (a class no job of the window is of is left out)."""
    out: list[WhatIfRow] = []
    a, b, d = doc["in_force"]["metrics"], doc["proposed"]["metrics"], doc["delta"]["metrics"]
    for fig, kind in OVERALL:
        out.append(_row("all jobs", fig, kind, a.get(fig), b.get(fig), d.get(fig)))
    for scope, label in (("teams", "team"), ("classes", "class")):
        a, b, d = doc["in_force"][scope], doc["proposed"][scope], doc["delta"][scope]
        for name in sorted(set(a) | set(b)):
            if not a.get(name, {}).get("jobs") and not b.get(name, {}).get("jobs"):
                continue
            for fig, kind in FIGURES:
                if fig in a.get(name, b.get(name, {})):
                    out.append(_row(f"{label} {name}", fig, kind, a.get(name, {}).get(fig),
                                    b.get(name, {}).get(fig), d.get(name, {}).get(fig)))
    return out


def _row(group: str, fig: str, kind: str, a: Any, b: Any, d: Any) -> WhatIfRow:
    def num(v: Any) -> float | None:
        return float(v) if isinstance(v, (int, float)) else None
    return {"group": group, "figure": fig, "kind": kind, "in_force": num(a), "proposed": num(b), "delta": num(d)}
