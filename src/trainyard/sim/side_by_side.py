"""A what-if's answer (`services/whatif.py`) as the rows of its side-by-side table: the whole
cluster's figures, then each team's and each class's, each with the configuration in force, the
proposed one and the delta. `yard cluster apply FILE --what-if` prints them and the dashboard's
configuration page draws them, so both show the same figures in the same order.
"""

from __future__ import annotations

from typing import Any, TypedDict

# (figure, kind): the rows per team and class, in this order. Kinds: s (seconds), share, n (a
# count), h (GPU-hours): how a row is shown.
FIGURES = (("mean_wait_s", "s"), ("p99_wait_s", "s"), ("mean_jct_s", "s"), ("gpu_share", "share"),
           ("quota_share", "share"), ("preemptions", "n"), ("lost_gpu_hours", "h"), ("busy_gpu_hours", "h"))
# The whole cluster's, from the simulator's metrics (sim/result.py).
OVERALL = (("avg_wait_s", "s"), ("p99_wait_s", "s"), ("avg_jct_s", "s"), ("utilization", "share"),
           ("preemptions", "n"), ("lost_gpu_hours", "h"))


class WhatIfRow(TypedDict):
    """One line: the group (`all jobs`, `team X`, `class Y`), the figure, its kind, the numbers."""
    group: str
    figure: str
    kind: str
    in_force: float | None
    proposed: float | None
    delta: float | None


def what_if_rows(doc: dict[str, Any]) -> list[WhatIfRow]:
    """The rows of a what-if answer; a class no job of the window is of is left out."""
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
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    return {"group": group, "figure": fig, "kind": kind, "in_force": num(a), "proposed": num(b), "delta": num(d)}
