"""Cluster commands: nodes (sinfo), drain / resume (scontrol update node), teams and quotas,
the versioned cluster configuration, and tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trainyard.cli.client import Client
from trainyard.cli.common import fail
from trainyard.cli.render import print_json, table

JSON = typer.Option(False, "--json", help="print JSON instead of a table")


def nodes(as_json: bool = JSON) -> None:
    """Nodes, like sinfo: GPUs free and used, GPU model and memory, topology, state."""
    ns = Client().get("/api/v1/nodes")["nodes"]
    if as_json:
        print_json(ns)
        return
    table(["NODE", "POOL", "STATE", "GPUS", "USED", "FREE", "MODEL", "MEM(GB)", "BLOCK", "RACK", "REASON"],
          [[n["name"], n["pool"], n["state"], n["gpus"], n["gpus_used"], n["gpus_free"], n["gpu_model"],
            f"{n['gpu_mem_gb']:g}", n["block"], n["rack"], n["reason"]] for n in ns])


def drain(node: str = typer.Argument(..., help="node name"),
          reason: str = typer.Option("", "--reason", help="why (shown in `yard nodes`)"), as_json: bool = JSON) -> None:
    """Drain a node: nothing new starts there; running jobs run on."""
    n = Client().post(f"/api/v1/nodes/{node}/drain", json={"reason": reason})
    print_json(n) if as_json else typer.echo(f"node {n['name']}: {n['state']}")


def resume(node: str = typer.Argument(..., help="node name"), as_json: bool = JSON) -> None:
    """Return a drained node to service."""
    n = Client().post(f"/api/v1/nodes/{node}/resume")
    print_json(n) if as_json else typer.echo(f"node {n['name']}: {n['state']}")


teams_app = typer.Typer(help="Teams and their quotas.", no_args_is_help=False, invoke_without_command=True)


@teams_app.callback()
def teams(ctx: typer.Context, as_json: bool = JSON) -> None:
    """List teams: cohort, quota per pool, GPUs in use and pending."""
    if ctx.invoked_subcommand is not None:
        return
    ts = Client().get("/api/v1/teams")["teams"]
    if as_json:
        print_json(ts)
        return
    rows = []
    for t in ts:
        for pool, q in (t["quotas"] or {"-": {}}).items():
            rows.append([t["name"], t["cohort"] or "", pool, q.get("nominal", ""),
                         "" if q.get("borrowing_limit") is None else q["borrowing_limit"],
                         "" if q.get("lending_limit") is None else q["lending_limit"], t["gpus_used"], t["gpus_pending"]])
    table(["TEAM", "COHORT", "POOL", "NOMINAL", "BORROW≤", "LEND≤", "USED", "PENDING"], rows)


@teams_app.command("set")
def teams_set(team: str = typer.Argument(...), nominal: int = typer.Option(..., "--nominal", min=0),
              borrowing_limit: Optional[int] = typer.Option(None, "--borrowing-limit", min=0),
              lending_limit: Optional[int] = typer.Option(None, "--lending-limit", min=0),
              pool: str = typer.Option("default", "--pool"), message: str = typer.Option("", "-m", "--message"),
              as_json: bool = JSON) -> None:
    """Set a team's quota in one pool (writes a new configuration version)."""
    c = Client()
    cur = c.get(f"/api/v1/teams/{team}")
    quotas = dict(cur["quotas"])
    quotas[pool] = {"nominal": nominal, "borrowing_limit": borrowing_limit, "lending_limit": lending_limit}
    out = c.put(f"/api/v1/teams/{team}", json={"quotas": quotas, "message": message})
    print_json(out) if as_json else typer.echo(f"team {team}: quota set (configuration version {out['config_version']})")


cluster_app = typer.Typer(help="The cluster configuration: versioned, with diff and rollback.", no_args_is_help=True)


@cluster_app.command("get")
def cluster_get(version: Optional[int] = typer.Option(None, "--version", min=1), as_json: bool = JSON) -> None:
    """Print the configuration in force (or an older version) as YAML."""
    v = Client().get("/api/v1/cluster/config", params={"version": version} if version else {})
    if as_json:
        print_json(v)
    else:
        typer.echo(f"# version {v['version']} by {v['author']}: {v['message']}")
        typer.echo(v["text"].rstrip("\n"))


@cluster_app.command("apply")
def cluster_apply(file: Path = typer.Argument(..., help="YAML file with cluster, teams and classes"),
                  message: str = typer.Option("", "-m", "--message", help="why (recorded)"), as_json: bool = JSON) -> None:
    """Validate a configuration and make it the newest version."""
    try:
        text = file.read_text()
    except OSError as e:
        fail(f"{file}: {e.strerror or e}")
    v = Client().post("/api/v1/cluster/config", json={"text": text, "message": message})
    print_json(v) if as_json else typer.echo(f"configuration version {v['version']} in force")


@cluster_app.command("history")
def cluster_history(as_json: bool = JSON) -> None:
    """Every version: who applied it, when, why."""
    import time
    vs = Client().get("/api/v1/cluster/config/versions")["versions"]
    if as_json:
        print_json(vs)
        return
    table(["VERSION", "WHEN", "BY", "MESSAGE"],
          [[v["version"], time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(v["created_at"])), v["author"], v["message"]]
           for v in vs])


@cluster_app.command("diff")
def cluster_diff(a: int = typer.Argument(..., min=1), b: int = typer.Argument(..., min=1), as_json: bool = JSON) -> None:
    """Unified diff between two versions."""
    d = Client().get("/api/v1/cluster/config/diff", params={"from": a, "to": b})
    print_json(d) if as_json else typer.echo(d["diff"] or f"versions {a} and {b} are the same", nl=False)


@cluster_app.command("rollback")
def cluster_rollback(version: int = typer.Argument(..., min=1), as_json: bool = JSON) -> None:
    """Apply an older version's text as the newest version."""
    v = Client().post("/api/v1/cluster/config/rollback", json={"version": version})
    print_json(v) if as_json else typer.echo(f"configuration version {v['version']} in force (copy of {version})")


token_app = typer.Typer(help="API tokens.", no_args_is_help=True)


@token_app.command("create")
def token_create(user: str = typer.Option(..., "--user"), role: str = typer.Option(..., "--role",
                 help="admin, operator, member or viewer"), team: Optional[str] = typer.Option(None, "--team"),
                 as_json: bool = JSON) -> None:
    """Create a token (admin only); it is printed once."""
    t = Client().post("/api/v1/tokens", json={"user": user, "role": role, "team": team})
    print_json(t) if as_json else typer.echo(t["token"])
