"""Small line charts as geometry for inline SVG, computed server-side (no charting library).

`line_chart` maps series of (x, y) points into a plot box and returns what the template
`_chart.html` draws: one polyline per unbroken run of points (a `None` y breaks the line), dots
for sparse series, "nice" axis ticks (1, 2, 5 x 10^k), vertical markers. The raw numbers go
into `data-*` attributes too, so a test (or a curious user) reads the values, not pixels.

A chart never fails on its numbers: a y that is not `figures.finite` (NaN, an infinity, beyond
±1e300, an integer no float holds) breaks the line like a gap, a point whose x is not is left out,
and the formatters write such values as text. A job's metrics are drawn here (issue 34: `loss:
1e308` made the job page answer 500).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from trainyard.figures import finite

Fmt = Callable[[float], str]
LEFT, RIGHT, TOP, BOTTOM = 58, 14, 12, 28  # the plot box's margins, in px


def fmt_number(v: float) -> str:
    """3 significant digits; thousands and millions as k and M, beyond 10^15 as 1.2e+18; "nan",
    "inf" as Python writes them, and "—" for what is no number a float holds."""
    try:
        v = float(v)
    except (OverflowError, TypeError, ValueError):
        return "—"
    a = abs(v)
    if not math.isfinite(v):
        return str(v)
    if a >= 1e15:
        return f"{v:.2e}"
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    if a != 0 and a < 1e-3:
        return f"{v:.1e}"
    return f"{v:.4g}" if a >= 1000 else f"{v:.3g}"


def fmt_ago(v: float) -> str:
    """Seconds relative to now (negative: in the past) as -45m, -6h, -2d or "now"."""
    a = -v
    if abs(a) < 1:
        return "now"
    for unit, s in (("d", 86400), ("h", 3600), ("m", 60)):
        if a >= s:
            return f"-{a / s:.3g}{unit}"
    return f"-{a:.0f}s"


def fmt_duration(v: float) -> str:
    """Seconds as 42s, 3.5m, 2.1h, 1.5d."""
    for unit, s in (("d", 86400), ("h", 3600), ("m", 60)):
        if abs(v) >= s:
            x = v / s
            return f"{x:.2g}{unit}" if abs(x) < 10 else f"{x:.0f}{unit}"
    return f"{v:.2g}s" if abs(v) < 10 else f"{v:.0f}s"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round values from lo to hi (inclusive where they fall on a tick)."""
    raw = (hi - lo) / max(1, n)
    if not (math.isfinite(lo) and math.isfinite(hi) and math.isfinite(raw)) or hi <= lo or raw <= 0:
        return [lo]  # (raw is 0 when the span is a few subnormals)
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 5, 10)), key=lambda st: abs((hi - lo) / st - n))
    first = math.ceil(lo / step - 1e-9) * step
    return [round(first + i * step, 12) for i in range(int((hi - first) / step + 1e-9) + 1)]


# Round steps for a time axis, in seconds: 1 2 5 10 15 30 s, 1 2 5 10 15 30 min, 1 2 3 6 12 h, 1 2 7 days.
DURATION_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
                  86400, 172800, 604800)


def duration_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` ticks on whole seconds, minutes, hours or days (not 100 s, 200 s: 1.7m, 3.3m)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or not 2 <= hi - lo <= 50 * DURATION_STEPS[-1]:
        return nice_ticks(lo, hi, n)
    step = min(DURATION_STEPS, key=lambda st: abs((hi - lo) / st - n))
    first = math.ceil(lo / step - 1e-9) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


@dataclass
class Series:
    name: str
    points: Sequence[tuple[float, float | None]]
    css: str = "s0"  # the stroke/fill class in dashboard.css
    dots: bool = False  # draw each point as a dot (sparse data) instead of lines


@dataclass
class Chart:
    width: int
    height: int
    title: str
    lines: list[tuple[str, str, str]] = field(default_factory=list)  # (css, "x,y x,y ...", series name)
    dots: list[tuple[str, float, float, str]] = field(default_factory=list)  # (css, x, y, tooltip)
    x_ticks: list[tuple[float, str]] = field(default_factory=list)  # (px, label)
    y_ticks: list[tuple[float, str]] = field(default_factory=list)
    markers: list[tuple[float, str]] = field(default_factory=list)  # vertical lines: (px, tooltip)
    legend: list[tuple[str, str]] = field(default_factory=list)  # (css, name)
    data: dict[str, str] = field(default_factory=dict)  # data-* attributes of the <svg>
    empty: str | None = None  # shown instead of a plot when there is nothing to draw
    bars: list[tuple[str, float, float, float, float, str]] = field(default_factory=list)  # (css, x, y, w, h, tip)

    @property
    def box(self) -> tuple[float, float, float, float]:
        return LEFT, TOP, self.width - RIGHT, self.height - BOTTOM


def line_chart(title: str, series: list[Series], *, width: int = 640, height: int = 200,
               x_range: tuple[float, float] | None = None, y_min: float | None = None,
               y_max: float | None = None, x_fmt: Fmt = fmt_number, y_fmt: Fmt = fmt_number,
               y_ticks: Callable[[float, float, int], list[float]] = nice_ticks,
               markers: Sequence[tuple[float, str]] = (), x_tick_values: Sequence[float] | None = None,
               empty: str = "no data yet") -> Chart:
    c = Chart(width, height, title, legend=[(s.css, s.name) for s in series if s.name])
    # Only numbers a scale can hold (module docstring): a y that is not one is a gap, an x drops the point.
    series = [Series(s.name, [(fx, finite(y)) for x, y in s.points if (fx := finite(x)) is not None], s.css, s.dots)
              for s in series]
    xs = [x for s in series for x, y in s.points if y is not None]
    ys = [y for s in series for _, y in s.points if y is not None]
    if not xs:
        c.empty = empty
        return c
    x0, x1 = x_range or (min(xs), max(xs))
    lo = min(ys) if y_min is None else min(y_min, min(ys))
    hi = max(ys) if y_max is None else max(y_max, max(ys))
    if hi == lo:
        lo, hi = (lo - 1, hi + 1) if lo else (0.0, 1.0)
    elif y_min is None:  # a little air below a free-floating curve
        lo -= (hi - lo) * 0.05
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    left, top, right, bottom = c.box

    def px(x: float) -> float:
        return round(left + (x - x0) / (x1 - x0) * (right - left), 1)

    def py(y: float) -> float:
        return round(bottom - (y - lo) / (hi - lo) * (bottom - top), 1)

    for s in series:
        pts = list(s.points)
        run: list[str] = []
        last = (0.0, 0.0)  # the run's newest point
        for x, y in pts + [(0.0, None)]:  # the sentinel closes the last run
            if y is None:
                if len(run) > 1:
                    c.lines.append((s.css, " ".join(run), s.name))
                elif run:  # a lone point between gaps: a dot, or it would not show
                    x_, y_ = last
                    c.dots.append((s.css, px(x_), py(y_), f"{s.name}: {y_fmt(y_)} at {x_fmt(x_)}"))
                run = []
            elif s.dots:
                c.dots.append((s.css, px(x), py(y), f"{s.name}: {y_fmt(y)} at {x_fmt(x)}"))
            else:
                run.append(f"{px(x)},{py(y)}")
                last = (x, y)
    ticks = nice_ticks(x0, x1, 6) if x_tick_values is None else [t for t in x_tick_values if x0 <= t <= x1]
    c.x_ticks = [(px(t), x_fmt(t)) for t in ticks]
    c.y_ticks = [(py(t), y_fmt(t)) for t in y_ticks(lo, hi, 4) if lo <= t <= hi]
    c.markers = [(px(x), tip) for x, tip in markers if x0 <= x <= x1]
    return c


def bar_chart(title: str, bars: list[tuple[str, float, str]], *, width: int = 400, height: int = 180,
              y_fmt: Fmt = fmt_number, y_ticks: Callable[[float, float, int], list[float]] = nice_ticks,
              empty: str = "nothing in this period") -> Chart:
    """Vertical bars, one per (label, value, css), from 0; the labels are the x ticks."""
    c = Chart(width, height, title)
    if not bars or not any(v > 0 for _, v, _ in bars):
        c.empty = empty
        return c
    left, top, right, bottom = c.box
    hi = max(v for _, v, _ in bars)
    slot = (right - left) / len(bars)
    for i, (label, v, css) in enumerate(bars):
        h = (bottom - top) * v / hi
        x = left + i * slot + slot * 0.15
        c.bars.append((css, round(x, 1), round(bottom - h, 1), round(slot * 0.7, 1), round(h, 1),
                       f"{label}: {y_fmt(v)}"))
        c.x_ticks.append((round(left + (i + 0.5) * slot, 1), label))
    c.y_ticks = [(round(bottom - (bottom - top) * t / hi, 1), y_fmt(t)) for t in y_ticks(0.0, hi, 4) if 0 <= t <= hi]
    return c


# the goodput ledger's buckets, in contracts.LEDGER_BUCKETS' order, each its fill (dashboard.css)
LEDGER_CSS = {"startup": "led-startup", "compute": "led-compute", "data_wait": "led-data_wait",
              "checkpoint_stall": "led-checkpoint_stall", "comm_wait": "led-comm_wait", "recompute": "led-recompute",
              "idle": "led-idle", "teardown": "led-teardown"}


def stacked_bar_chart(title: str, stacks: list[tuple[str, dict[str, float]]], *, width: int = 560, height: int = 220,
                      y_fmt: Fmt = fmt_number, empty: str = "nothing in this period") -> Chart:
    """One bar per (label, {bucket: value}), its buckets stacked from 0 in LEDGER_CSS's order; a
    value that is no finite positive number adds nothing. The legend names every bucket."""
    c = Chart(width, height, title, legend=[(css, name.replace("_", " ")) for name, css in LEDGER_CSS.items()])
    clean = [(label, {b: v for b in LEDGER_CSS if (v := finite(parts.get(b))) is not None and v > 0})
             for label, parts in stacks]
    totals = [sum(parts.values()) for _, parts in clean]
    if not clean or not any(t > 0 for t in totals):
        c.empty = empty
        return c
    left, top, right, bottom = c.box
    hi = max(totals)
    slot = (right - left) / len(clean)
    for i, (label, parts) in enumerate(clean):
        x, base = round(left + i * slot + slot * 0.15, 1), float(bottom)
        for b, v in parts.items():
            h = (bottom - top) * v / hi
            c.bars.append((LEDGER_CSS[b], x, round(base - h, 1), round(slot * 0.7, 1), round(h, 1),
                           f"{label} {b.replace('_', ' ')}: {y_fmt(v)}"))
            base -= h
        c.x_ticks.append((round(left + (i + 0.5) * slot, 1), label))
    c.y_ticks = [(round(bottom - (bottom - top) * t / hi, 1), y_fmt(t)) for t in nice_ticks(0.0, hi, 4) if 0 <= t <= hi]
    return c
