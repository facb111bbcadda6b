"""`yard reservation create|list|delete`: admin reservations (Slurm's `scontrol create
reservation`, `scontrol show reservation`, `scontrol delete reservation`), kept in the versioned
cluster configuration (`services/reservations.py`). Jobs run in one with `yard submit
--reservation=NAME` (also `#SBATCH --reservation`).

`--start` takes sbatch's `--begin` forms (`now`, `now+1hour`, `16:00`, `2026-12-02T10:00`), read in
the user's time zone and sent as UNIX seconds; `--duration` Slurm's (a bare number is minutes,
`HH:MM:SS`, `D-HH[:MM[:SS]]`) or `30m`, `2h`. Anything malformed is an error naming the option,
exit 2, nothing stored; unknown nodes, users and teams come back from the API the same way.
"""

from __future__ import annotations

import time
from typing import Optional
from urllib.parse import quote

import typer

from trainyard.cli.client import Client
from trainyard.cli.common import fail
from trainyard.cli.render import print_json, table
from trainyard.cli.safe_text import clean
from trainyard.contracts import expand_hostlist
from trainyard.spec.parsing import parse_begin, parse_duration

JSON = typer.Option(False, "--json", help="print JSON instead of a table")

app = typer.Typer(help="Admin reservations: nodes held for some users and teams over a time window.",
                  no_args_is_help=True)


def _names(value: str | None, option: str) -> list[str]:
    return [x.strip() for x in (value or "").split(",") if x.strip()]


def _duration(raw: str) -> float:
    s = raw.strip()
    try:
        d = parse_duration(f"{s}m" if s.isdigit() else s)  # a bare number is minutes, as in Slurm
    except ValueError as e:
        fail(f"--duration: {e}")
    if d is None or d <= 0:
        fail(f"--duration: must be positive, got {raw!r}")
    return d


@app.command("create")
def create(nodes: str = typer.Option(..., "--nodes", help="nodes in Slurm's hostlist form: node-[0-1],gpu-3"),
           start: str = typer.Option(..., "--start", help="as sbatch --begin: now, now+1hour, 16:00, 2026-12-02T10:00"),
           duration: str = typer.Option(..., "--duration", help="minutes, HH:MM:SS, D-HH[:MM[:SS]], or 30m, 2h"),
           users: Optional[str] = typer.Option(None, "--users", help="users it is for, comma-separated"),
           teams: Optional[str] = typer.Option(None, "--teams", "--accounts", help="teams it is for, comma-separated"),
           name: Optional[str] = typer.Option(None, "--name", help="its name (default resv-N)"),
           message: str = typer.Option("", "-m", "--message", help="why (recorded)"), as_json: bool = JSON) -> None:
    """Hold nodes for some users and teams from --start for --duration (admin)."""
    try:
        if not expand_hostlist(nodes):
            fail("--nodes: give the nodes to reserve")
    except ValueError as e:
        fail(f"--nodes: {e}")
    try:
        at = parse_begin(start, time.time())
    except ValueError as e:
        fail(f"--start: {e}")
    secs = _duration(duration)
    us, ts = _names(users, "--users"), _names(teams, "--teams")
    if not us and not ts:
        fail("--users/--teams: give the users or teams the reservation is for")
    body = {"nodes": nodes, "start": at, "duration": secs, "users": us, "teams": ts, "message": message}
    if name is not None:
        body["name"] = name
    r = Client().post("/api/v1/reservations", json=body)
    if as_json:
        print_json(r)
    else:
        typer.echo(f"reservation {clean(r['name'])} created: {clean(r['nodes'])} from {_when(r['start'])} "
                   f"to {_when(r['end'])} ({r['state']}; configuration version {r['config_version']})")


@app.command("list")
def list_(as_json: bool = JSON) -> None:
    """Reservations: name, state (planned, active, ended), nodes, start, end, users, teams."""
    rs = Client().get("/api/v1/reservations")["reservations"]
    if as_json:
        print_json(rs)
        return
    table(["NAME", "STATE", "NODES", "START", "END", "USERS", "TEAMS"],
          [[r["name"], r["state"], r["nodes"], _when(r["start"]), _when(r["end"]), ",".join(r["users"]),
            ",".join(r["teams"])] for r in rs])


@app.command("delete")
def delete(name: str = typer.Argument(..., help="the reservation's name"), as_json: bool = JSON) -> None:
    """Delete a reservation (admin); jobs waiting in it stay pending (ReservationDeleted)."""
    r = Client().delete(f"/api/v1/reservations/{quote(name, safe='')}")
    print_json(r) if as_json else typer.echo(f"reservation {clean(name)} deleted "
                                             f"(configuration version {r['config_version']})")


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))
