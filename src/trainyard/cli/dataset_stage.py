"""`yard dataset stage NAME[:VERSION] [--nodes node-[0-1]]`: a dataset copied into the nodes'
caches ahead of the jobs that read it (issue 41; docs/control-plane.md, "Storage"), as a job's
start would stage it — verified against its checksum, once per node. An admin, or a member of a
team that may use the dataset. Without a version, its newest; without --nodes, every node.

NAME[:VERSION] and the hostlist are checked here first (exit 2 naming them). A staging may take
minutes: the command waits for it, prints a line per node (copied, or found cached) and exits 1 if
any node failed. `stage` is the command's function; `cli/dataset.py`'s group wires it in.
"""

from __future__ import annotations

import re
from typing import Optional

import typer

from trainyard.cli.client import Client
from trainyard.cli.common import fail
from trainyard.cli.render import print_json, table
from trainyard.cli.safe_text import clean
from trainyard.contracts import expand_hostlist

STAGE_WAIT_S = 4 * 3600.0  # a source's own time limit (SourceAccess.timeout_s) ends a copy before this
_LABEL = re.compile(r"^[a-z][a-z0-9_-]{0,62}(:[A-Za-z0-9][A-Za-z0-9._-]{0,63})?$")  # staging.types NAME_RE:VERSION_RE


def _size(n: float | None) -> str:
    from trainyard.cli.storage import size

    return "" if n is None else size(n)


def stage(dataset: str = typer.Argument(..., help="NAME or NAME:VERSION from the catalogue (`yard dataset ls`)"),
          nodes: Optional[str] = typer.Option(None, "--nodes", "-w", help="only these nodes (hostlist: node-[0-1])"),
          as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table")) -> None:
    """Stage a dataset on every node (or --nodes) ahead of the jobs that read it."""
    if not _LABEL.fullmatch(dataset.strip()):
        fail(f"NAME[:VERSION]: {dataset!r} is not a dataset name (lower-case letters, digits, - and _), "
             "optionally :VERSION")
    if nodes is not None:
        try:
            if not expand_hostlist(nodes.strip()):
                raise ValueError(f"no node names in {nodes!r}")
        except ValueError as e:
            fail(f"--nodes: {e}")
    body = {"dataset": dataset.strip(), "nodes": nodes.strip() if nodes is not None else None}
    out = Client(timeout=STAGE_WAIT_S).post("/api/v1/datasets/stage", json=body)
    if as_json:
        print_json(out)
    else:
        typer.echo(f"{clean(out['dataset'])} {out['checksum']}")
        table(["NODE", "RESULT", "SIZE", "SECONDS"],
              [[r["node"], ("copied" if r["copied"] else "cached") if r["ok"] else f"FAILED: {clean(r['error'])}",
                _size(r["bytes"]), "" if r["seconds"] is None else f"{r['seconds']:.1f}"] for r in out["nodes"]],
              plain=True)
    if any(not r["ok"] for r in out["nodes"]):
        raise typer.Exit(1)
