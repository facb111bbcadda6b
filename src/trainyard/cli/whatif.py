"""`yard cluster apply FILE --what-if` and `yard trace export`: the cluster's own history, through a
proposed configuration or into a file (`services/whatif.py`, `sim/history.py`).

Times (`--since`, `--until`) are read in your time zone (`spec.parsing.parse_time`: now-14days,
today, 2026-11-01T08:00 …) and sent as UNIX seconds; a bad one is exit 2 before anything is asked.
"""

from __future__ import annotations

import time
from typing import Any

import typer

from trainyard.cli.client import Client
from trainyard.cli.common import fail
from trainyard.cli.render import print_json, table

# (figure, how it is shown): the table's rows per team and class, in this order.
FIGURES = (("mean_wait_s", "s"), ("p99_wait_s", "s"), ("mean_jct_s", "s"), ("gpu_share", "share"),
           ("quota_share", "share"), ("preemptions", "n"), ("lost_gpu_hours", "h"), ("busy_gpu_hours", "h"))

WHAT_IF_TIMEOUT_S = 600.0

# The whole cluster's, from `yard sim`'s metrics (sim/result.py).
OVERALL = (("avg_wait_s", "s"), ("p99_wait_s", "s"), ("avg_jct_s", "s"), ("utilization", "share"),
           ("preemptions", "n"), ("lost_gpu_hours", "h"))


def window(since: str | None, until: str | None) -> dict[str, float]:
    """`--since`/`--until` as UNIX seconds (exit 2 on a bad time, or an end before the start)."""
    from trainyard.spec.parsing import parse_time

    now = time.time()
    out: dict[str, float] = {}
    for key, value in (("since", since), ("until", until)):
        if value is not None:
            try:
                out[key] = parse_time(value, now)
            except ValueError as e:
                fail(f"--{key}: {e}")
    if "since" in out and "until" in out and out["until"] < out["since"]:
        fail("--until is before --since")
    return out


def _fmt(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "s":
        from trainyard.sim.report import format_value

        return format_value("x_s", float(value), with_seconds=False)
    if kind == "share":
        return f"{value:.3f}"
    if kind == "h":
        return f"{value:.2f}"
    return f"{value:g}"


def _signed(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    text = _fmt(abs(value), kind)
    if not value or text.strip("0.s") == "":  # nothing, or less than the figure shows
        return "0"
    return f"{'-' if value < 0 else '+'}{text}"


def rows(doc: dict[str, Any]) -> list[list[str]]:
    """One row per team or class and figure: in force, proposed, delta."""
    out: list[list[str]] = []
    a, b, d = doc["in_force"]["metrics"], doc["proposed"]["metrics"], doc["delta"]["metrics"]
    for fig, kind in OVERALL:
        out.append(["all jobs", fig, _fmt(a.get(fig), kind), _fmt(b.get(fig), kind), _signed(d.get(fig), kind)])
    for scope in ("teams", "classes"):
        a, b, d = doc["in_force"][scope], doc["proposed"][scope], doc["delta"][scope]
        for name in sorted(set(a) | set(b)):
            if not a.get(name, {}).get("jobs") and not b.get(name, {}).get("jobs"):
                continue  # a class no job of the window is of
            for fig, kind in FIGURES:
                if fig not in a.get(name, b.get(name, {})):
                    continue
                out.append([f"{scope[:-1] if scope == 'teams' else 'class'} {name}", fig,
                            _fmt(a.get(name, {}).get(fig), kind), _fmt(b.get(name, {}).get(fig), kind),
                            _signed(d.get(name, {}).get(fig), kind)])
    return out


def show_what_if(text: str, since: str | None, until: str | None, as_json: bool) -> None:
    """Ask for the what-if and print it (nothing is applied)."""
    # Weeks of a busy cluster are two replays of tens of seconds each (bench/README.md, "What-if").
    doc = Client(timeout=WHAT_IF_TIMEOUT_S).post("/api/v1/cluster/config/what-if",
                                                 json={"text": text, **window(since, until)})
    if as_json:
        print_json(doc)
        return
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(doc["since"]))
    typer.echo(f"what-if on {doc['jobs']} jobs submitted since {stamp}: configuration version {doc['version']} "
               f"({doc['in_force']['policy']}) against the proposal ({doc['proposed']['policy']}); nothing applied")
    for note in doc["proposed"]["notes"][1:]:
        typer.echo(f"note (proposal): {note}")
    table(["GROUP", "FIGURE", "IN FORCE", "PROPOSED", "DELTA"], rows(doc), plain=True)
