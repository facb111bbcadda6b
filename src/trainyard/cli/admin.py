"""Cluster commands: nodes (sinfo), drain / resume (scontrol update node), teams and quotas,
and the versioned cluster configuration (tokens: `cli/tokens.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trainyard.cli.client import Client
from trainyard.cli.common import fail
from trainyard.cli.render import print_json, table
from trainyard.cli.safe_text import clean, clean_lines

JSON = typer.Option(False, "--json", help="print JSON instead of a table")


def nodes(as_json: bool = JSON) -> None:
    """Nodes, like sinfo: GPUs free and used, GPU model and memory, topology, how jobs are contained
    (cgroup2, cgroup1, subreaper, or the cluster engine's own), state."""
    ns = Client().get("/api/v1/nodes")["nodes"]
    if as_json:
        print_json(ns)
        return
    table(["NODE", "POOL", "STATE", "GPUS", "USED", "FREE", "MODEL", "MEM(GB)", "BLOCK", "RACK", "CONTAIN", "REASON"],
          [[n["name"], n["pool"], state_word(n), n["gpus"], n["gpus_used"], n["gpus_free"], n["gpu_model"],
            f"{n['gpu_mem_gb']:g}", n["block"], n["rack"], n.get("containment", ""),
            "; ".join(x for x in (n["reason"], n.get("suspect_reason")) if x)] for n in ns])


def state_word(n: dict) -> str:
    """The node's state, `+suspect` while a straggler suspicion holds it (control/loop/suspects.py)."""
    return f"{n['state']}+suspect" if n.get("suspect_since") is not None else str(n["state"])


def drain(node: str = typer.Argument(..., help="node name"),
          reason: str = typer.Option("", "--reason", help="why (shown in `yard nodes`)"), as_json: bool = JSON) -> None:
    """Drain a node: nothing new starts there; running jobs run on."""
    n = Client().post(f"/api/v1/nodes/{node}/drain", json={"reason": reason})
    print_json(n) if as_json else typer.echo(f"node {clean(n['name'])}: {n['state']}")


def resume(node: str = typer.Argument(..., help="node name"), as_json: bool = JSON) -> None:
    """Return a drained node to service."""
    n = Client().post(f"/api/v1/nodes/{node}/resume")
    print_json(n) if as_json else typer.echo(f"node {clean(n['name'])}: {n['state']}")


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


def _limit(value: str | None, option: str) -> int | None | str:
    """A limit as typed: a number of GPUs, or `none` (no limit: the field is removed); "" for not given."""
    if value is None:
        return ""
    if value.strip().lower() in ("none", "unlimited"):
        return None
    if not value.strip().isdigit():
        fail(f"{option}: expected a number of GPUs or 'none', got {value!r}")
    return int(value)


@teams_app.command("set")
def teams_set(team: str = typer.Argument(...),
              nominal: Optional[int] = typer.Option(None, "--nominal", min=0, help="GPUs the team is guaranteed"),
              borrowing_limit: Optional[str] = typer.Option(None, "--borrowing-limit",
                                                            help="most GPUs it may borrow beyond its nominal, or none"),
              lending_limit: Optional[str] = typer.Option(None, "--lending-limit",
                                                          help="most of its idle GPUs it lends, or none"),
              cohort: Optional[str] = typer.Option(None, "--cohort", help="its cohort ('' for none)"),
              pool: str = typer.Option("default", "--pool"), message: str = typer.Option("", "-m", "--message"),
              as_json: bool = JSON) -> None:
    """Change a team's quota in one pool, or its cohort: only the fields given change, everything else
    in the configuration stays as it was, comments included (a new configuration version)."""
    fields: dict[str, int | None] = {} if nominal is None else {"nominal": nominal}
    for key, value, option in (("borrowing_limit", borrowing_limit, "--borrowing-limit"),
                               ("lending_limit", lending_limit, "--lending-limit")):
        v = _limit(value, option)
        if v != "":
            fields[key] = v  # type: ignore[assignment]
    if not fields and cohort is None:
        fail("give what to change: --nominal, --borrowing-limit, --lending-limit or --cohort")
    body: dict = {"message": message}
    if fields:
        body["quotas"] = {pool: fields}
    if cohort is not None:
        body["cohort"] = cohort
    out = Client().patch(f"/api/v1/teams/{team}", json=body)
    for w in out.get("warnings", []):
        typer.echo(f"warning: {clean(w)}", err=True)
    print_json(out) if as_json else typer.echo(f"team {clean(team)}: updated (configuration version "
                                               f"{out['config_version']})")


cluster_app = typer.Typer(help="The cluster configuration: versioned, with diff and rollback.", no_args_is_help=True)


@cluster_app.command("get")
def cluster_get(version: Optional[int] = typer.Option(None, "--version", min=1), as_json: bool = JSON) -> None:
    """Print the configuration in force (or an older version) as YAML."""
    v = Client().get("/api/v1/cluster/config", params={"version": version} if version else {})
    if as_json:
        print_json(v)
    else:
        typer.echo(f"# version {v['version']} by {clean(v['author'])}: {clean(v['message'])}")
        typer.echo(clean_lines(v["text"].rstrip("\n")))


@cluster_app.command("apply")
def cluster_apply(file: Path = typer.Argument(..., help="YAML file with cluster, teams and classes"),
                  message: str = typer.Option("", "-m", "--message", help="why (recorded)"),
                  pilot: bool = typer.Option(False, "--pilot", help="try its health and node-feature changes on the "
                                             "pilot pool first (yard cluster pilot)"), as_json: bool = JSON,
                  what_if: bool = typer.Option(False, "--what-if", help="apply nothing: replay the cluster's own "
                                               "history through it and the version in force (cli/whatif.py)"),
                  since: Optional[str] = typer.Option(None, "--since", help="--what-if: history from (default now-14days)"),
                  until: Optional[str] = typer.Option(None, "--until", help="--what-if: history to (default now)")) -> None:
    """Validate a configuration and make it the newest version (--what-if: show what it would do)."""
    try:
        text = file.read_text()
    except OSError as e:
        fail(f"{file}: {e.strerror or e}")
    if what_if or since is not None or until is not None:
        from trainyard.cli.whatif import show_what_if

        if not what_if or pilot:
            fail("--since/--until: only with --what-if" if not what_if else "--what-if: not with --pilot")
        return show_what_if(text, since, until, as_json)
    v = Client().post("/api/v1/cluster/pilot" if pilot else "/api/v1/cluster/config", json={"text": text, "message": message})
    for w in v.get("warnings", []):
        typer.echo(f"warning: {clean(w)}", err=True)
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
    print_json(d) if as_json else typer.echo(clean_lines(d["diff"]) or f"versions {a} and {b} are the same", nl=False)


@cluster_app.command("rollback")
def cluster_rollback(version: int = typer.Argument(..., min=1), as_json: bool = JSON) -> None:
    """Apply an older version's text as the newest version."""
    v = Client().post("/api/v1/cluster/config/rollback", json={"version": version})
    print_json(v) if as_json else typer.echo(f"configuration version {v['version']} in force (copy of {version})")


from trainyard.cli.pilot import pilot_app  # noqa: E402 - `yard cluster pilot`, a group of its own module

cluster_app.add_typer(pilot_app, name="pilot")
