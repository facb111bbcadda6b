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


_BEGIN_UNITS = {"": 1, "s": 1, "sec": 1, "second": 1, "seconds": 1, "m": 60, "min": 60, "minute": 60, "minutes": 60,
                "h": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400,
                "w": 604800, "week": 604800, "weeks": 604800}
_NAMED = {"midnight": (0, 0), "tomorrow": (0, 0), "noon": (12, 0), "teatime": (16, 0)}


def parse_begin(value: str, now: float) -> float:
    """A start time as `sbatch --begin` takes it → UNIX seconds, in this machine's time zone.

    `now` and `today`, `now+90` (seconds), `now+30minutes` / `now+2hours` / `now+1days` (Slurm's
    units, also `s`, `m`, `h`, `d`, `w`), `HH:MM[:SS]` and `midnight` (or `tomorrow`), `noon`,
    `teatime` (the next such time, today or tomorrow), `YYYY-MM-DD[THH:MM[:SS]]`. Raises ValueError naming what it cannot read."""
    import datetime as dt

    s = value.strip().lower()
    if s == "today":
        return now
    m = re.fullmatch(r"now(?:\+(\d+)\s*([a-z]*))?", s)
    if m:
        if m.group(1) is None:
            return now
        if m.group(2) not in _BEGIN_UNITS:
            raise ValueError(f"unknown unit {m.group(2)!r} in {value!r}; units are seconds, minutes, hours, days, weeks")
        return now + int(m.group(1)) * _BEGIN_UNITS[m.group(2)]
    here = dt.datetime.fromtimestamp(now).astimezone()
    hm = _NAMED.get(s)
    m = re.fullmatch(r"(\d{1,2}):(\d{2})(?::(\d{2}))?", s)
    if hm or m:
        h, mi, se = (*hm, 0) if hm else (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
        try:
            at = here.replace(hour=h, minute=mi, second=se, microsecond=0)
        except ValueError:
            raise ValueError(f"{value!r} is not a time of day") from None
        return (at if at.timestamp() > now else at + dt.timedelta(days=1)).timestamp()
    m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})(?:t(\d{1,2}):(\d{2})(?::(\d{2}))?)?", s)
    if m:
        y, mo, d, h, mi, se = (int(x) if x else 0 for x in m.groups())
        try:
            return dt.datetime(y, mo, d, h, mi, se).astimezone().timestamp()
        except ValueError as e:
            raise ValueError(f"{value!r} is not a date: {e}") from None
    raise ValueError(f"cannot read {value!r} as a start time (examples: now+1hour, now+30minutes, 16:00, "
                     "2026-12-24T08:00, midnight)")
