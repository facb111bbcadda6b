"""Numbers a job reports (its metrics.jsonl, its progress reports), made safe to compute with,
draw, format and send as JSON.

A job writes what it likes: `NaN`, `Infinity`, `1e308`, `-1e400` (JSON reads it as -inf), an
integer of 400 digits, a string, a step of 10**30. JSON has no NaN or Infinity (an encoder that
refuses them answers 500), a float cannot hold a 400-digit integer (OverflowError wherever one is
converted, even by `math.isfinite`), and a chart's scale overflows between -1e308 and 1e308 (its
span is infinite). So every figure of a job passes `finite` (a value) or `step` (an x position)
before the plane computes with it; what fails is "not a number to draw", shown as such, never an
error.

Standard library only: the dashboard (services/dashboard.py), the charts (api/charts.py) and the
progress reports (services/progress.py) share it.
"""

from __future__ import annotations

import math

LIMIT = 1e300  # |value| above this is not drawn: a chart's span (hi - lo) and its margins stay finite
MAX_STEP = 2**62  # as ProgressReport's step; beyond it an x position is not a float's integer
MAX_INT = 2**63 - 1  # the largest integer a figure may keep as an integer (a 64-bit one)


def finite(v: object, limit: float = LIMIT) -> float | None:
    """`v` as a float when it is a real number (an int or a float, not a bool) of magnitude at
    most `limit`; None for NaN, infinities, larger or unrepresentable numbers and anything else."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:  # an integer beyond a float's range
        return None
    return f if math.isfinite(f) and abs(f) <= limit else None


def step(v: object) -> int | None:
    """`v` when it is an integer step (not a bool) from 0 to MAX_STEP; None otherwise."""
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_STEP else None


def json_number(v: object) -> object:
    """`v` itself when JSON can carry it and every reader can hold it (a finite float, a 64-bit
    int); None for NaN, infinities and larger integers; anything that is not a number unchanged."""
    if isinstance(v, bool):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, int):
        return v if -MAX_INT - 1 <= v <= MAX_INT else None
    return v
