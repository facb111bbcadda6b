"""Aligned columns that fit the terminal by cutting only the columns that may be cut.

Rich's tables shrink every column alike when a line is too wide, so a long failure reason in
`yard queue` turned the job id, team and user into "…", the very cells one needs to act on a
job. Here each column says whether it is kept whole (ids, users, states, times: short, and what
a person copies) or may be cut (names, reasons: long, and readable from a prefix). When a line
would be wider than the terminal, the cut-able columns give up width, the widest first, down to
`MIN_CUT` characters each, ending in "…"; the others never shrink, so a terminal too narrow
even for them gets long lines (wrapped by the terminal), never a hidden id.

The width is `$COLUMNS` when set, else the terminal's; output into a pipe or a file is not cut
at all (a script reading `yard queue` gets whole cells).
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from typing import Sequence

from trainyard.cli.safe_text import clean

MIN_CUT = 6  # a cut column keeps at least this many characters (its last one "…")
GAP = 1  # as squeue: the queue's ten columns then fit 80 characters


@dataclass(frozen=True)
class Column:
    header: str
    cut: bool = False  # may be cut to fit the width (names, reasons); else always whole
    right: bool = False


def terminal_width() -> int | None:
    """Columns to fit into: $COLUMNS, else the terminal's; None (no limit) for a pipe or a file."""
    raw = os.environ.get("COLUMNS", "")
    if raw.strip().isdigit() and int(raw) > 0:
        return int(raw)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def widths(columns: Sequence[Column], cells: Sequence[Sequence[str]], width: int | None) -> list[int]:
    """Each column's width: its widest cell, then the cut-able ones narrowed until the line fits."""
    out = [max([len(c.header)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    if width is None:
        return out
    over = sum(out) + GAP * (len(out) - 1) - width
    while over > 0:
        shrinkable = [i for i, c in enumerate(columns) if c.cut and out[i] > MIN_CUT]
        if not shrinkable:
            break
        i = max(shrinkable, key=lambda k: out[k])
        others = max([out[k] for k in shrinkable if k != i] + [MIN_CUT])
        step = min(over, out[i] - others) or 1  # down to the next widest, then one at a time
        out[i] -= step
        over -= step
    return out


def render(columns: Sequence[Column], rows: Sequence[Sequence[object]], width: int | None = None,
           header: bool = True) -> list[str]:
    """The lines of a table: cells cleaned of control characters (`safe_text`), aligned, fitted."""
    cells = [[clean(c) for c in r] for r in rows]
    ws = widths(columns, cells, width)

    def line(values: Sequence[str]) -> str:
        parts = [cut(v, w).rjust(w) if c.right else cut(v, w).ljust(w) for c, v, w in zip(columns, values, ws)]
        return (" " * GAP).join(parts).rstrip()

    return ([line([c.header for c in columns])] if header else []) + [line(r) for r in cells]
