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

WHAT_IF_TIMEOUT_S = 600.0

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
    """One row per team or class and figure: in force, proposed, delta (sim/side_by_side.py)."""
    from trainyard.sim.side_by_side import what_if_rows

    return [[r["group"], r["figure"], _fmt(r["in_force"], r["kind"]), _fmt(r["proposed"], r["kind"]),
             _signed(r["delta"], r["kind"])] for r in what_if_rows(doc)]


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
