"""The calibration every benchmark quotes (bench/README.md): a plain Python loop of 1M additions."""

from __future__ import annotations

import statistics
import time


def calibrate_ms(reps: int = 3) -> float:
    """The loop's time in ms, median of `reps` runs."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        x = 0
        for i in range(1_000_000):
            x += i
        out.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(out), 1)
