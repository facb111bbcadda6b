"""Input parsing that every command needs, importable without pydantic or YAML: the error type that
names file, line and field, durations (`30m`, Slurm's `D-HH:MM:SS`) and node ranges (`-N 2-4`).

Kept apart from `trainyard.spec.models` (the configuration models) so that the CLI's client commands,
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
        a, b, c = m.groups()
        return float(int(a) * 60 + int(b) if c is None else int(a) * 3600 + int(b) * 60 + int(c))
    m = re.fullmatch(r"(\d+)-(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?", s)
    if m:
        d, h, mi, se = (int(x) if x else 0 for x in m.groups())
        return float(d * 86400 + h * 3600 + mi * 60 + se)
    raise ValueError(f"cannot read {value!r} as a duration (examples: 90, '30m', '2h', '1-12:00:00')")


_MEM_UNITS = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
MAX_MEM_MIB = 1 << 40  # a petabyte-scale sanity bound


def parse_mem_mib(value: Any) -> int:
    """MiB from Slurm's memory sizes (`--mem`, `--mem-per-gpu`): a number of megabytes, or one with
    a K, M, G or T suffix (`16G`, `500M`, `2T`; an optional trailing B, any case). Slurm's units
    are binary (1G = 1024M). `0` is Slurm's "all the node's memory", i.e. no limit: returned as 0.

    Raises:
        ValueError: not a size, negative, or absurdly large (a fraction of a MiB rounds up to 1).
    """
    if isinstance(value, bool) or value is None:
        raise ValueError("a memory size must be a number of MB or a string such as '16G'")
    if isinstance(value, (int, float)):
        mib = float(value)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)b?\s*", str(value).lower())
        if not m:
            raise ValueError(f"cannot read {value!r} as a memory size (examples: 16G, 500M, 2048)")
        mib = float(m.group(1)) * _MEM_UNITS[m.group(2) or "m"]
    if mib < 0:
        raise ValueError("a memory size cannot be negative")
    if mib > MAX_MEM_MIB:
        raise ValueError(f"{value!r} is more memory than any node has")
    return int(-(-mib // 1))  # whole MiB, rounded up


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
    m = re.fullmatch(r"(\d{1,2}):(\d{2})(?::(\d{2}))?", s)
    hms = (int(m[1]), int(m[2]), int(m[3] or 0)) if m else (*_NAMED[s], 0) if s in _NAMED else None
    if hms:
        h, mi, se = hms
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


# UNIX seconds: `@` and any number, or a bare number of 9 to 11 digits (1973 to 5138: MMDD and MMDDYY are 4 and 6)
_EPOCH = re.compile(r"@(\d+(?:\.\d+)?)|(\d{9,11}(?:\.\d+)?)")
_CLOCK = r"(\d{1,2}):(\d{2})(?::(\d{2}))?"


def parse_time(value: str | float | int, now: float) -> float:
    """A point in time as `sacct -S/-E` and `sreport start=/end=` take it → UNIX seconds, in this
    machine's time zone.

    Forms (any case): `now`, `now-7days`, `now+2hours`, `now-90` (seconds; units s, m, h, d, w and
    their long names), `today` or `midnight` (00:00 today), `yesterday` (00:00 yesterday),
    `HH:MM[:SS]` (today), `YYYY-MM-DD[THH:MM[:SS]]`, Slurm's `MM/DD[/YY]`, `MM.DD[.YY]` and
    `MMDD[YY]` (each with an optional `-HH:MM[:SS]`), and UNIX seconds (`1764500000`, or `@` and
    any number: `@86400.5`). A number is UNIX seconds.

    Raises:
        ValueError: what it cannot read, with examples.
    """
    import datetime as dt

    if isinstance(value, bool):
        raise ValueError("a time must be text such as now-7days or 2026-11-01, or UNIX seconds")
    if isinstance(value, (int, float)):
        if not 0 <= value < 1e11:
            raise ValueError(f"{value!r} is not a time in UNIX seconds")
        return float(value)
    s = str(value).strip().lower()
    here = dt.datetime.fromtimestamp(now).astimezone()
    midnight = here.replace(hour=0, minute=0, second=0, microsecond=0)
    m = re.fullmatch(r"now(?:\s*([+-])\s*(\d+)\s*([a-z]*))?", s)
    if m:
        if m.group(1) is None:
            return now
        if m.group(3) not in _BEGIN_UNITS:
            raise ValueError(f"unknown unit {m.group(3)!r} in {value!r}; units are seconds, minutes, hours, days, "
                             "weeks")
        step = int(m.group(2)) * _BEGIN_UNITS[m.group(3)]
        return now + step if m.group(1) == "+" else now - step
    if s in ("today", "midnight"):
        return midnight.timestamp()
    if s == "yesterday":
        return (midnight - dt.timedelta(days=1)).timestamp()
    m = _EPOCH.fullmatch(s)
    if m:
        seconds = float(m.group(1) or m.group(2))
        if not seconds < 1e11:  # also inf, from hundreds of digits
            raise ValueError(f"{value[:40]!r} is not a time in UNIX seconds (they end before 1e11, in the year 5138)")
        return seconds

    def at(y: int, mo: int, d: int, clock: tuple[str | None, ...] = (None, None, None)) -> float:
        h, mi, se = (int(x) if x else 0 for x in clock)
        try:
            return dt.datetime(y, mo, d, h, mi, se).astimezone().timestamp()
        except ValueError as e:
            raise ValueError(f"{value!r} is not a date and time: {e}") from None

    m = re.fullmatch(_CLOCK, s)
    if m:
        return at(here.year, here.month, here.day, m.groups())
    m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})(?:[t ]" + _CLOCK + r")?", s)
    if m:
        return at(int(m.group(1)), int(m.group(2)), int(m.group(3)), m.groups()[3:])
    m = re.fullmatch(r"(?:(\d{2})(\d{2})(\d{2})?|(\d{1,2})([/.])(\d{1,2})(?:\5(\d{2}|\d{4}))?)(?:-" + _CLOCK + r")?", s)
    if m:
        mo, d, y = (m.group(1), m.group(2), m.group(3)) if m.group(1) else (m.group(4), m.group(6), m.group(7))
        year = here.year if y is None else int(y) + (2000 if len(y) == 2 else 0)
        return at(year, int(mo), int(d), m.groups()[7:])
    raise ValueError(f"cannot read {value!r} as a time (examples: now-7days, now-2hours, today, yesterday, 08:00, "
                     "2026-11-01, 2026-11-01T08:00, 11/01, 1101, 1764500000)")
