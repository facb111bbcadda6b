"""`yard trace fetch|list|export`: the public traces `yard sim` replays, on a machine that has none,
and the cluster's own history as a trace (`export`, `--format trainyard`: `sim/history.py`).

`fetch` downloads a trace's files from their pinned public source into `<data dir>/traces/`,
keeping each only once its size and SHA-256 match (`sim/trace_catalog.py`); `list` says what
each trace is and whether it is there. A bad trace name is exit 2; a download that fails or does
not verify is exit 1, with nothing of that file left behind. `export` asks the plane (admin) for the
jobs submitted in the window and writes them, one JSON line each, to a temporary file renamed onto
`--out` at the end: nothing half-written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trainyard.cli.common import fail

app = typer.Typer(help="Traces for `yard sim`: the public ones (fetch, list), the cluster's own (export).",
                  no_args_is_help=True)

DATA_DIR_HELP = "where traces/ goes (default: $YARD_DATA_DIR or ~/.trainyard)"


def _data_dir(data_dir: Path | None) -> Path:
    from trainyard.defaults import default_data_dir

    return data_dir or default_data_dir()


@app.command("fetch")
def fetch(
    names: list[str] = typer.Argument(..., help="philly, pollux, or all"),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
    mirror: Optional[str] = typer.Option(None, "--mirror",
                                         help="an address holding the same files in place of the source's"),
    force: bool = typer.Option(False, "--force", help="download again even where a verified copy is there"),
) -> None:
    """Download a trace's files, each checked against its SHA-256, into DATA_DIR/traces/<name>/."""
    from trainyard.sim.trace_catalog import CATALOG, FetchError
    from trainyard.sim.trace_catalog import fetch as fetch_trace

    wanted = list(CATALOG) if names == ["all"] else names
    unknown = [n for n in wanted if n not in CATALOG]
    if unknown:
        fail(f"unknown trace {unknown[0]!r}; known: {', '.join(CATALOG)} (or all)")
    if mirror is not None and not mirror.startswith(("http://", "https://", "file://")):
        fail(f"--mirror: {mirror!r} is not an http://, https:// or file:// address")
    root = _data_dir(data_dir)
    for name in wanted:
        try:
            fetch_trace(name, root, mirror=mirror, force=force, say=typer.echo)
        except FetchError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None


@app.command("list")
def list_traces(data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=DATA_DIR_HELP)) -> None:
    """Each trace, its files, and whether a verified copy is in the data dir."""
    from trainyard.sim.trace_catalog import CATALOG, is_fetched, local_path

    root = _data_dir(data_dir)
    for t in CATALOG.values():
        have = sum(is_fetched(root, t.name, f) for f in t.files)
        typer.echo(f"{t.name}: {t.about}")
        typer.echo(f"  {have} of {len(t.files)} files verified in {local_path(root, t.name, '')}; "
                   f"`--trace {t.name}` is {t.default_file}")


@app.command("export")
def export(
    out: Path = typer.Option(..., "--out", help="the trace file to write (JSON lines)"),
    since: Optional[str] = typer.Option(None, "--since", help="jobs submitted from (default now-14days)"),
    until: Optional[str] = typer.Option(None, "--until", help="... and before (default now)"),
) -> None:
    """The cluster's own jobs as a trace for `yard sim --format trainyard --config CLUSTER.yaml`."""
    import os
    import tempfile

    from trainyard.cli.client import Client
    from trainyard.cli.whatif import window
    from trainyard.sim.history import write_history

    if out.is_dir():
        fail(f"--out: {out} is a folder")
    doc = Client(timeout=300.0).get("/api/v1/cluster/trace", params=window(since, until))  # months of jobs
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(write_history(doc["records"]))
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    typer.echo(f"{doc['jobs']} jobs written to {out}", err=True)
