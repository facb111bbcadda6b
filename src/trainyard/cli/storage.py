"""`yard storage`: the disk job dirs take, per team, against the quotas and the reserve (as `lfs
quota` or `du` per project would say it; the plane measures, control/lifecycle/storage.py), each
team's tiers and kinds, and what the lifecycle rules delete next (services/storage_view.py).

    yard storage            per team: used, quota, use%, job dirs; per tier and kind; the file
                            systems and their reserve; the next deletions of the rules
    yard storage -j 10      and the ten biggest job dirs
    yard storage --refresh  an admin's: every job dir measured now, whole, before the answer
"""

from __future__ import annotations

import time

import typer

from trainyard.cli.client import Client
from trainyard.cli.render import ago, clock, print_json, table
from trainyard.cli.safe_text import clean

JSON = typer.Option(False, "--json", help="print JSON instead of tables")


def size(n: float | None) -> str:
    """Bytes in binary units, as `du -h` prints them."""
    if n is None:
        return "-"
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1024:
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}P"


def _state(t: dict) -> str:
    if t["over"]:
        return "OVER: new jobs wait (StorageQuota)"
    return "" if t["complete"] else "estimate (a walk was cut)"


def storage(jobs: int = typer.Option(0, "-j", "--jobs", min=0, max=1000, help="also list the N biggest job dirs"),
            next_n: int = typer.Option(20, "-n", "--next", min=0, max=1000,
                                       help="the N soonest deletions of the lifecycle rules (0: none)"),
            refresh: bool = typer.Option(False, "--refresh", help="measure every job dir now, whole (admin)"),
            as_json: bool = JSON) -> None:
    """Disk per team: what its job dirs hold (checkpoints, logs, metrics), its quota, its archive
    and dataset-cache tiers, the free space kept for the store and the plane, and what the rules
    delete next."""
    params = {"jobs": jobs, "next": next_n}
    r = Client().post("/api/v1/storage/refresh", params=params) if refresh else \
        Client().get("/api/v1/storage", params=params)
    if as_json:
        print_json(r)
        return
    table(["TEAM", "USED", "QUOTA", "USE%", "JOBDIRS", "STATE"],
          [[clean(t["team"]) if t["team"] is not None else "(no job)", size(t["bytes"]), size(t["quota_bytes"]),
            "" if not t["quota_bytes"] else f"{100 * t['bytes'] / t['quota_bytes']:.0f}", t["jobs"], _state(t)]
           for t in r["teams"]])
    if r["measured_at"] is None:
        typer.echo("not measured yet: the first measurement is under way")
    else:
        typer.echo(f"measured {ago(r['measured_at'], time.time())} ago in {r['sweep_s']:.1f}s, every "
                   f"{r['interval_s']:g}s")
    for fs in r["file_systems"]:
        low = "  UNDER THE RESERVE: no new attempt starts (DiskReserve)" if fs["low"] else ""
        inodes = f", {fs['inodes_free']} of {fs['inodes']} inodes free" if fs["inodes"] else ""
        typer.echo(f"{clean(fs['path'])}: {size(fs['free'])} free of {size(fs['size'])}{inodes}; reserve "
                   f"{size(fs['reserve'])}{low}")
    typer.echo("")
    table(["TEAM", "FAST", "CHECKPOINTS", "LOGS", "METRICS", "OTHER", "ARCHIVE", "DATASETS"],
          [[clean(t["team"]) if t["team"] is not None else "(no job)", size(t["tiers"]["fast"]["apparent_bytes"]),
            *(size(t["tiers"]["fast"]["kinds"].get(k, 0)) for k in ("checkpoints", "logs", "metrics", "other")),
            size(t["tiers"]["archive"]["bytes"]), size(t["tiers"]["datasets"]["bytes"])] for t in r["teams"]],
          title="per tier and kind (apparent sizes, as du -sb)")
    if next_n:
        _next(r)
    if jobs:
        table(["JOBID", "TEAM", "USER", "USED", "MEASURED"],
              [[j["job_id"], clean(j["team"]), clean(j["user"]), size(j["bytes"]) + ("" if j["complete"] else "+"),
                ago(j["measured_at"], time.time())] for j in r["jobs"]])


def _next(r: dict) -> None:
    if not r["next"]:
        typer.echo("the lifecycle rules delete nothing now or on a known date")
        return
    now = r["now"]
    table(["WHEN", "JOBID", "TEAM", "WHAT", "SIZE", "RULE"],
          [["now" if n["at"] <= now else clock(n["at"], now), n["job_id"], clean(n["team"]),
            f"checkpoint {n['step']} ({'+'.join(n['tiers'])})" if n["what"] == "checkpoint" else n["what"],
            size(n["bytes"]), clean(n["rule"])] for n in r["next"]], title="what the rules delete next")
