"""Printing for the cluster commands: aligned columns as Slurm prints them, or JSON with `--json`.

Big listings (`yard queue` over thousands of jobs) are printed as plain aligned text, which stays
fast at 10,000 rows; small ones go through Rich.
"""

from __future__ import annotations

import json
import time
from typing import Any, Sequence

import typer

RICH_MAX_ROWS = 200


def print_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


def ago(t: float | None, now: float | None = None) -> str:
    if t is None:
        return ""
    return duration((now or time.time()) - t)


def duration(s: float | None) -> str:
    if s is None:
        return ""
    s = max(0, int(s))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:d}:{s:02d}"


def clock(t: float | None) -> str:
    if t is None:
        return ""
    lt = time.localtime(t)
    return time.strftime("%H:%M:%S" if time.time() - t < 20 * 3600 and t <= time.time() + 20 * 3600
                         else "%Y-%m-%dT%H:%M", lt)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    if len(rows) > RICH_MAX_ROWS:
        cells = [[str(c) for c in r] for r in rows]
        widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
        typer.echo("\n".join(lines))
        return
    from rich.console import Console  # here: a big listing's command need not import Rich at all
    from rich.table import Table

    t = Table(title=title, box=None, header_style="bold", pad_edge=False)
    for h in headers:
        t.add_column(h, no_wrap=True)
    for r in rows:
        t.add_row(*[str(c) for c in r])
    Console(width=max(160, Console().width)).print(t)


def nodelist(placement: list[dict] | None) -> str:
    if not placement:
        return ""
    return ",".join(f"{p['node']}[{','.join(str(g) for g in p['gpus'])}]" for p in placement)
