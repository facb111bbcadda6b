"""`yard cluster pilot`: the pilot pool's trial (services/pilot.py) — its status, the pilot's
figures beside the rest's, then `promote` or `rollback`. A trial starts with
`yard cluster apply FILE --pilot` (cli/admin.py)."""

from __future__ import annotations

import time
from typing import Any

import typer

from trainyard.cli.client import Client
from trainyard.cli.render import print_json, table
from trainyard.cli.safe_text import clean

JSON = typer.Option(False, "--json", help="print JSON instead of a table")
MESSAGE = typer.Option("", "-m", "--message", help="why (recorded)")

pilot_app = typer.Typer(help="The pilot pool: a change of health checks or node features tried on a few nodes first.",
                        no_args_is_help=True)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _rows(sides: dict[str, Any]) -> list[list[Any]]:
    p, r = sides["pilot"], sides["rest"]
    out = [["nodes", len(p["nodes"]), len(r["nodes"])],
           ["attempts ended", p["attempts_ended"], r["attempts_ended"]],
           ["attempts failed", p["attempts_failed"], r["attempts_failed"]],
           ["failure rate", _pct(p["failure_rate"]), _pct(r["failure_rate"])]]
    out += [[k, p[k], r[k]] for k in ("downs", "suspects", "remediations")]
    out += [["GPU-hours allocated", f"{p['allocated_gpu_s'] / 3600:.2f}", f"{r['allocated_gpu_s'] / 3600:.2f}"],
            ["goodput", _pct(p["goodput"]), _pct(r["goodput"])]]
    return out


@pilot_app.command("status")
def status(as_json: bool = JSON) -> None:
    """The trial in progress (what it changes, since when) and, since it began, the pilot against
    the rest: attempts ended and failed, node downs, suspects and remediations, goodput."""
    st = Client().get("/api/v1/cluster/pilot/status")
    if as_json:
        print_json(st)
        return
    if st["pilot"] is None:
        typer.echo(f"configuration version {st['version']}: no pilot pool (pilot: {{nodes: ...}} names one)")
        return
    typer.echo(f"pilot: {clean(', '.join(st['pilot']['nodes']))} (configuration version {st['version']})")
    t = st["trial"]
    if t is None:
        typer.echo("no trial in progress (yard cluster apply FILE --pilot starts one)")
        return
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t["since"]))
    typer.echo(f"trial since {since}, on version {t['base_version']}{': ' + clean(t['message']) if t['message'] else ''}")
    for c in t["changes"]:
        typer.echo(f"  {clean(c)}")
    table(["SINCE THE TRIAL BEGAN", "PILOT", "REST"], _rows(st["sides"]))


def _step(step: str, message: str, as_json: bool) -> None:
    v = Client().post(f"/api/v1/cluster/pilot/{step}", json={"message": message})
    print_json(v) if as_json else typer.echo(f"configuration version {v['version']} in force ({clean(v['message'])})")


@pilot_app.command("promote")
def promote(message: str = MESSAGE, as_json: bool = JSON) -> None:
    """Apply the trial to every node and end it (a new configuration version)."""
    _step("promote", message, as_json)


@pilot_app.command("rollback")
def rollback(message: str = MESSAGE, as_json: bool = JSON) -> None:
    """End the trial: every node back on the configuration's own settings (a new configuration version)."""
    _step("rollback", message, as_json)
