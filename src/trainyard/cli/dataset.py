"""`yard dataset`: the dataset catalogue (services/datasets.py; docs/control-plane.md, "Storage").

    yard dataset add NAME --version V --source PATH|s3://… [--checksum sha256:…] [--team T] [--description D]
    yard dataset ls [NAME] [--node N|all]        the versions you may see; --node: what the nodes' caches hold
    yard dataset show NAME[:VERSION]             a dataset's versions (or one)
    yard dataset grant NAME TEAM [--revoke]      let another team's jobs use it (its team's members or an admin)
    yard dataset checksum PATH                   a file's or directory's checksum, computed here (for datasets:)

A job asks for datasets with `--dataset NAME[:VERSION],…` (cli/dataset_opts.py). Adding a version
makes the plane read the whole source once (its checksum): the command waits for it. Arguments
are checked here first (exit 2 naming the option); the plane's refusals name the field too.
"""

from __future__ import annotations

import re
import time
from typing import Any, Optional

import typer

from trainyard.cli import dataset_stage
from trainyard.cli.client import EXIT_UNAVAILABLE, Client, error_message
from trainyard.cli.common import EXIT_BAD_INPUT, fail
from trainyard.cli.render import print_json, table
from trainyard.cli.safe_text import clean
from trainyard.cli.storage import size
from trainyard.staging.types import CHECKSUM_RE, NAME_RE, VERSION_RE

JSON = typer.Option(False, "--json", help="print JSON instead of a table")
ADD_WAIT_S = 24 * 3600.0  # reading a big source takes its time; the plane's own limits end a stuck read
SOURCE_RE = re.compile(r"^(/[^\x00\n]*|s3://[a-z0-9][a-z0-9.-]{1,62}[a-z0-9](/[^\x00\n]*)?)$")

app = typer.Typer(help="The dataset catalogue: add, list, show, share; what the nodes' caches hold.",
                  no_args_is_help=True)


def _check(value: str | None, pattern: re.Pattern[str], option: str, what: str) -> None:
    if value is not None and not pattern.match(value):
        fail(f"{option}: {value!r} is not {what}")


def _name(raw: str, option: str = "NAME") -> str:
    _check(raw, NAME_RE, option, "a dataset name (a lower-case letter, then lower-case letters, digits, _ and -)")
    return raw


def _ask(raw: str) -> tuple[str, str | None]:
    name, colon, version = raw.strip().partition(":")
    _name(name, "NAME[:VERSION]")
    if colon:
        _check(version, VERSION_RE, "NAME[:VERSION]", "a version (letters, digits and ._-)")
    return name, version if colon else None


@app.command("add")
def add(name: str = typer.Argument(..., help="the dataset's name: [a-z][a-z0-9_-]*"),
        version: str = typer.Option(..., "--version", "-v", help="its version (letters, digits, ._-); never changes"),
        source: str = typer.Option(..., "--source", "-s", help="an absolute path (a shared file system) or "
                                   "s3://bucket/key of a configured object store; a file or a directory"),
        checksum: Optional[str] = typer.Option(None, "--checksum", help="sha256:<hex> it must hash to "
                                               "(yard dataset checksum PATH); default: computed by the plane"),
        team: Optional[str] = typer.Option(None, "--team", "-A", help="the team it belongs to (default: your token's)"),
        description: str = typer.Option("", "--description", help="a line saying what it is"),
        as_json: bool = JSON) -> None:
    """Add a dataset version: the plane reads the source (a path as your Unix account) and records its
    size, files and checksum."""
    _name(name)
    _check(version, VERSION_RE, "--version", "a version (letters, digits and ._-, at most 64)")
    _check(source, SOURCE_RE, "--source", "an absolute path or an s3://bucket/key URL")
    _check(checksum, CHECKSUM_RE, "--checksum", "sha256: and 64 lower-case hexadecimal digits")
    body: dict[str, Any] = {"name": name, "version": version, "source": source, "description": description}
    body.update({k: v for k, v in (("checksum", checksum), ("team", team)) if v is not None})
    out = Client(timeout=ADD_WAIT_S).post("/api/v1/datasets", json=body)
    if as_json:
        print_json(out)
        return
    files = f"{out['files']} file{'s' if out['files'] != 1 else ''}"
    typer.echo(f"Added {out['name']}:{out['version']} (team {out['team']}): {files}, {size(out['bytes'])}, "
               f"{out['checksum']}")


def _rows(entries: list[dict[str, Any]]) -> list[list[Any]]:
    return [[e["name"], e["version"], e["team"], size(e["bytes"]), "-" if e["files"] is None else e["files"],
             clean(e["source"]), ",".join(e["grants"]) or "-", e["origin"]] for e in entries]


def _node_entries(node: str, as_json: bool) -> None:
    """`--node`: the nodes' caches, as the plane's `GET /api/v1/datasets/cache` says."""
    c = Client()
    r = c.http.request("GET", "/api/v1/datasets/cache", params={"node": node})
    if r.status_code == 404 and r.headers.get("content-type", "").startswith("application/json") \
            and r.json().get("detail") == "Not Found":
        typer.echo("error: this control plane does not report the nodes' dataset caches (no "
                   "/api/v1/datasets/cache); upgrade it", err=True)
        raise typer.Exit(EXIT_UNAVAILABLE)
    if r.status_code >= 500:
        typer.echo(f"error: server error at /api/v1/datasets/cache: HTTP {r.status_code}", err=True)
        raise typer.Exit(EXIT_UNAVAILABLE)
    if r.status_code >= 400:
        typer.echo(f"error: {clean(error_message(r))}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    entries = r.json()["entries"]
    if as_json:
        print_json(entries)
        return
    table(["NODE", "NAME", "VERSION", "CHECKSUM", "SIZE", "LAST USED", "IN USE"],
          [[e["node"], e["name"], e["version"], e["checksum"][:19], size(e["bytes"]),
            time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(e["last_used"])), "yes" if e["in_use"] else ""]
           for e in entries])


@app.command("ls")
def ls(name: Optional[str] = typer.Argument(None, help="only this dataset's versions"),
       node: Optional[str] = typer.Option(None, "--node", "-w", help="what these nodes' caches hold instead "
                                          "(a node, a hostlist, or all)"),
       as_json: bool = JSON) -> None:
    """The dataset versions you may see (your team's, those granted to it; admins and operators all):
    version, team, size, source, grants; with --node, where each version is staged."""
    if name is not None:
        _name(name)
    if node is not None:
        if not node.strip():
            fail("--node: give a node, a hostlist or all")
        _node_entries(node.strip(), as_json)
        return
    out = Client().get("/api/v1/datasets", params={"name": name} if name else None)["datasets"]
    if as_json:
        print_json(out)
        return
    table(["NAME", "VERSION", "TEAM", "SIZE", "FILES", "SOURCE", "GRANTS", "ORIGIN"], _rows(out))


@app.command("show")
def show(dataset: str = typer.Argument(..., help="NAME or NAME:VERSION"), as_json: bool = JSON) -> None:
    """A dataset's versions (or one): source, checksum, size, files, grants, who added it."""
    name, version = _ask(dataset)
    out = Client().get(f"/api/v1/datasets/{name}/versions", params={"version": version} if version else None)
    if as_json:
        print_json(out)
        return
    for i, v in enumerate(out["versions"]):
        if i:
            typer.echo("")
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(v["added_at"])) if v["added_at"] else None
        for key, value in (("Dataset", f"{v['name']}:{v['version']}"), ("Team", v["team"]),
                           ("Source", v["source"]), ("Checksum", v["checksum"]),
                           ("Size", "-" if v["bytes"] is None else f"{size(v['bytes'])} ({v['bytes']} bytes)"),
                           ("Files", "-" if v["files"] is None else v["files"]),
                           ("Grants", ", ".join(v["grants"]) or "-"),
                           ("Origin", v["origin"] + (f", added by {v['added_by']} at {when}" if v["added_by"] else "")),
                           ("Description", v["description"] or "-")):
            typer.echo(f"{key + ':':<13}{clean(str(value))}")


@app.command("grant")
def grant(name: str = typer.Argument(..., help="the dataset"),
          team: str = typer.Argument(..., help="the team whose jobs may use it"),
          revoke: bool = typer.Option(False, "--revoke", help="take the grant back"),
          as_json: bool = JSON) -> None:
    """Let TEAM's jobs use every version of NAME (or no longer, --revoke): its team's members or an admin."""
    _name(name)
    if not team.strip():
        fail("TEAM: give a team")
    c = Client()
    out = (c.delete(f"/api/v1/datasets/{name}/grants/{team}") if revoke
           else c.post(f"/api/v1/datasets/{name}/grants", json={"team": team}))
    if as_json:
        print_json(out)
        return
    what = "no longer granted to" if revoke else "granted to"
    note = "" if out["changed"] else " (it was already so)"
    typer.echo(f"{name} (team {out['team']}) {what} {team}{note}; grants: {', '.join(out['grants']) or 'none'}")


@app.command("checksum")
def checksum(path: str = typer.Argument(..., help="a file or a directory on this machine")) -> None:
    """Print the checksum of a file or a directory as datasets have it (sha256:…), for a `datasets:` entry."""
    from trainyard.staging.checksum import of_local
    from trainyard.staging.types import DataStagingError

    try:
        typer.echo(of_local(path))
    except DataStagingError as e:
        fail(f"{path}: {str(e).removeprefix(path + ': ')}")
    except OSError as e:
        fail(f"{path}: {e.strerror or e}")


app.command("stage")(dataset_stage.stage)  # `yard dataset stage`: pre-staging on the nodes (cli/dataset_stage.py)
