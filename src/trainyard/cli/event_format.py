"""`yard events`'s columns: the default layout and `--format`/`-o` by name (`time,job,why:60`).

As in `yard queue` (`cli/columns.py`), the time, actor, event, job and node are always whole and
only the message (WHY) is cut to fit the terminal; a size (`why:60`) fixes a column's most.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from trainyard.cli.columns import Column, cut, render


@dataclass(frozen=True)
class Field:
    name: str
    header: str
    show: Callable[[dict[str, Any]], str]
    cut: bool = False


FIELDS: tuple[Field, ...] = (
    Field("time", "TIME", lambda e: time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(e["time"]))),
    Field("actor", "ACTOR", lambda e: e["actor"]),
    Field("event", "EVENT", lambda e: e["kind"]),
    Field("job", "JOB", lambda e: str(e["job_id"] or "")),
    Field("node", "NODE", lambda e: e["node"] or ""),
    Field("why", "WHY", lambda e: e["message"], cut=True),
)
BY_NAME = {f.name: f for f in FIELDS} | {"kind": FIELDS[2], "message": FIELDS[5], "jobid": FIELDS[3]}
DEFAULT = "time,actor,event,job,node,why"


def parse(text: str, option: str = "--format") -> list[tuple[Field, int | None]]:
    """`name[:size],…` → fields; an unknown name or a bad size is a ValueError naming `option`."""
    out = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        name, _, size = part.partition(":")
        f = BY_NAME.get(name.lower())
        if f is None:
            raise ValueError(f"{option}: unknown field {name!r} (known: {', '.join(BY_NAME)})")
        if size and not (size.isdigit() and int(size) > 0):
            raise ValueError(f"{option}: {part!r}: the size must be a whole number of characters")
        out.append((f, int(size) if size else None))
    if not out:
        raise ValueError(f"{option}: no field (e.g. {DEFAULT})")
    return out


def lines(events: list[dict[str, Any]], fields: list[tuple[Field, int | None]], width: int | None,
          header: bool = True) -> list[str]:
    cols = [Column(f.header, cut=f.cut and size is None) for f, size in fields]
    rows = [[f.show(e) if size is None else cut(f.show(e), size) for f, size in fields] for e in events]
    return render(cols, rows, width, header=header)
