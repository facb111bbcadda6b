"""`yard image pull|ls|rm`: the nodes' image caches (docs/control-plane.md, "Environment images").

    yard image pull IMAGE [--nodes node-[0-3]]   pre-stage: resolve the digest once, pull on every node (admin)
    yard image ls [--node N]                     what each node's cache holds (admins and operators)
    yard image rm IMAGE|DIGEST [--node N]        remove it where no running job uses it (admin)

IMAGE is written as `--container-image` takes it (enroot's `REGISTRY#IMAGE` or Docker's form),
checked here first (exit 2 naming it). A pull may take minutes: the command waits for it, then
prints a line per node and exits 1 if any node failed.
"""

from __future__ import annotations

import time
from typing import Optional

import typer

from trainyard.cli.client import Client
from trainyard.cli.common import fail
from trainyard.cli.image_view import short_digest
from trainyard.cli.render import print_json, table
from trainyard.cli.safe_text import clean
from trainyard.contracts import expand_hostlist
from trainyard.spec.image_ref import parse_image

JSON = typer.Option(False, "--json", help="print JSON instead of a table")
PULL_WAIT_S = 4 * 3600.0  # the plane's own limit (images.pull_timeout_s) ends a pull before this

app = typer.Typer(help="The nodes' image caches: pre-stage (pull), list, remove.", no_args_is_help=True)


def _image(raw: str) -> str:
    try:
        if raw.strip().startswith("sha256:"):
            return raw.strip()
        parse_image(raw, "IMAGE")
    except ValueError as e:
        fail(str(e))
    return raw.strip()


def _nodes(raw: str | None, option: str) -> str | None:
    if raw is None:
        return None
    try:
        if not expand_hostlist(raw.strip()):
            raise ValueError(f"no node names in {raw!r}")
    except ValueError as e:
        fail(f"{option}: {e}")
    return raw.strip()


def size(n: float | None) -> str:
    from trainyard.cli.storage import size as du

    return du(n)


@app.command("pull")
def pull(image: str = typer.Argument(..., help="as --container-image: nvcr.io#nvidia/pytorch:24.01-py3, "
                                               "127.0.0.1:5000/team/img:1"),
         nodes: Optional[str] = typer.Option(None, "--nodes", "-w", help="only these nodes (hostlist: node-[0-1])"),
         as_json: bool = JSON) -> None:
    """Pull an image on every node (or --nodes) ahead of the jobs that run it (admin)."""
    body = {"image": _image(image), "nodes": _nodes(nodes, "--nodes")}
    out = Client(timeout=PULL_WAIT_S).post("/api/v1/images/pull", json=body)
    if as_json:
        print_json(out)
    else:
        typer.echo(f"{clean(out['image'])}@{out['digest']}")
        table(["NODE", "RESULT", "SIZE"], [[r["node"], "pulled" if r["ok"] else f"FAILED: {clean(r['error'])}",
                                            size(r["size_bytes"])] for r in out["nodes"]], plain=True)
    if any(not r["ok"] for r in out["nodes"]):
        raise typer.Exit(1)


@app.command("ls")
def ls(node: Optional[str] = typer.Option(None, "--node", "-w", help="only these nodes (hostlist)"),
       as_json: bool = JSON) -> None:
    """The images cached on each node: name, digest, size, last used, in use (admins and operators)."""
    out = Client().get("/api/v1/images", params={"node": _nodes(node, "--node")} if node else None)["images"]
    if as_json:
        print_json(out)
        return
    table(["NODE", "IMAGE", "DIGEST", "SIZE", "LAST USED", "IN USE"],
          [[e["node"], clean(e["name"]), short_digest(e["digest"]), size(e["size_bytes"]),
            time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(e["last_used"])), "yes" if e["in_use"] else ""]
           for e in out])


@app.command("rm")
def rm(image: str = typer.Argument(..., help="an image (by tag: every cached digest of its repository) or a "
                                             "digest sha256:..."),
       node: Optional[str] = typer.Option(None, "--node", "-w", help="only these nodes (hostlist)"),
       as_json: bool = JSON) -> None:
    """Remove an image from the caches where no running job uses it (admin)."""
    out = Client().post("/api/v1/images/remove", json={"image": _image(image), "nodes": _nodes(node, "--node")})
    if as_json:
        print_json(out["removed"])
    else:
        table(["NODE", "IMAGE", "DIGEST", "RESULT"],
              [[r["node"], clean(r["name"]), short_digest(r["digest"]),
                "removed" if r["removed"] else f"kept: {r['why']}"] for r in out["removed"]], plain=True)
    if any(not r["removed"] for r in out["removed"]):
        raise typer.Exit(1)
