"""Printing for the cluster commands: aligned columns as Slurm prints them, or JSON with `--json`.

Big listings (`yard queue` over thousands of jobs) are printed as plain aligned text, which stays
fast at 10,000 rows; small ones go through Rich.

Every cell is user input to someone: control characters are escaped (`cli/safe_text.py`) and,
under Rich, a cell is plain text, never markup (`[red]` or `[link=…]` in a job name stays text).
"""

from __future__ import annotations

import json
import time
from typing import Any, Sequence

import typer

from trainyard.cli.safe_text import clean
from trainyard.contracts import compress_hostlist

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


def clock(t: float | None, now: float | None = None) -> str:
    """A time of today as HH:MM:SS, any other (an estimated start two days on, a start yesterday)
    with its date, local time: a bare 01:00:00 read at 23:00 would mean an hour ago or two on.
    The year is left out within this year (12-04T08:00), so that the queue fits 80 columns."""
    if t is None:
        return ""
    lt = time.localtime(t)
    today = time.localtime(time.time() if now is None else now)
    if (lt.tm_year, lt.tm_yday) == (today.tm_year, today.tm_yday):
        return time.strftime("%H:%M:%S", lt)
    return time.strftime("%m-%dT%H:%M" if lt.tm_year == today.tm_year else "%Y-%m-%dT%H:%M", lt)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None, *,
          plain: bool = False) -> None:
    """Rows under headers. `plain` (and any listing over RICH_MAX_ROWS): aligned text that is never
    cut, however wide (Rich shrinks columns to the terminal, cutting a state to `PREEMP…`)."""
    if plain or len(rows) > RICH_MAX_ROWS:
        cells = [[clean(c) for c in r] for r in rows]
        widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
        typer.echo("\n".join(lines))
        return
    from rich.console import Console  # here: a big listing's command need not import Rich at all
    from rich.table import Table
    from rich.text import Text

    t = Table(title=None if title is None else Text(clean(title)), box=None, header_style="bold", pad_edge=False)
    for h in headers:
        t.add_column(h, no_wrap=True)
    for r in rows:
        t.add_row(*[Text(clean(c)) for c in r])
    Console(width=max(160, Console().width)).print(t)


def nodelist(placement: list[dict] | None) -> str:
    """A placement's nodes in Slurm's hostlist form (node-[0-1]), as squeue's NODELIST shows them.
    The GPUs are `gpu_indices`' to show: brackets after a node name mean node numbers in Slurm."""
    if not placement:
        return ""
    return compress_hostlist(p["node"] for p in placement)


def gpu_indices(placement: list[dict] | None) -> str:
    """The GPUs of a placement per node, node name apart from the indices as Slurm's IDX does:
    `node-0:0-1 node-1:0,2`."""
    if not placement:
        return ""
    return " ".join(f"{p['node']}:{index_ranges(p['gpus'])}" for p in placement)


def index_ranges(indices: Sequence[int]) -> str:
    """0,1,2,5 -> 0-2,5 (scontrol's GRES IDX form)."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(indices):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)
