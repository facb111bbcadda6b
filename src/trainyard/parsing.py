"""Input parsing that every command needs, importable without pydantic or YAML: the error type that
names file, line and field, durations (`30m`, Slurm's `D-HH:MM:SS`) and node ranges (`-N 2-4`).

Kept apart from `trainyard.spec` (the configuration models) so that the CLI's client commands,
which only parse their arguments and call the API, start without loading the model stack:
`yard queue` is typed many times a day.
"""

from __future__ import annotations

import re
from typing import Any


class ConfigError(ValueError):
    """Bad configuration or input: says which file, line and field, and why."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None, field: str | None = None):
        self.file, self.line, self.field, self.message = file, line, field, message
        where = ":".join(str(x) for x in (file, line) if x is not None)
        parts = [p for p in (where, f"field '{field}'" if field else None) if p]
        super().__init__(f"{', '.join(parts)}: {message}" if parts else message)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: Any) -> float | None:
    """Seconds from a number, a `30m`-style string, or Slurm's `MM:SS`, `HH:MM:SS`, `D-HH[:MM[:SS]]` forms.

    A bare number is seconds here (configuration files); the CLI's `--time`, like Slurm's,
    reads a bare number as minutes (`trainyard.cli.sbatch.slurm_time`)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("a duration must be a number of seconds or a string such as '30m'")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return float(value)
    s = str(value).strip().lower()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw]?)", s)
    if m:
        return float(m.group(1)) * _UNITS[m.group(2) or "s"]
    # Slurm's forms: MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
    m = re.fullmatch(r"(\d+):(\d{1,2})(?::(\d{1,2}))?", s)
    if m:
        a, b, c = (int(x) if x else None for x in m.groups())
        return float(a * 60 + b if c is None else a * 3600 + b * 60 + c)
    m = re.fullmatch(r"(\d+)-(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?", s)
    if m:
        d, h, mi, se = (int(x) if x else 0 for x in m.groups())
        return float(d * 86400 + h * 3600 + mi * 60 + se)
    raise ValueError(f"cannot read {value!r} as a duration (examples: 90, '30m', '2h', '1-12:00:00')")


def parse_node_range(value: Any) -> tuple[int, int]:
    """`2` or `"2-4"` (Slurm's `-N MIN-MAX`) → (min, max)."""
    if isinstance(value, bool):
        raise ValueError("nodes must be a number or a range such as '2-4'")
    if isinstance(value, int):
        lo = hi = value
    else:
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", str(value))
        if not m:
            raise ValueError(f"cannot read {value!r} as a node count or range (examples: 2, '2-4')")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
    if lo < 1:
        raise ValueError("nodes must be at least 1")
    if hi < lo:
        raise ValueError(f"node range {value!r} has its maximum below its minimum")
    return lo, hi
