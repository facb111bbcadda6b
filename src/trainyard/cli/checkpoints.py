"""`yard checkpoints`: a job's committed checkpoints, where each copy is, and keep marks (issue 41).

    yard checkpoints JOB                      each committed step: tiers (fast, archive), size, metrics, keep
    yard checkpoints keep JOB STEP [--undo]   the step stays in the fast tier and no rule deletes it

The plane sees the steps every `storage.archive.interval` (control/lifecycle/checkpoint_tiers.py):
a step committed since is listed at its next look.
"""

from __future__ import annotations

import typer

from trainyard.cli.client import Client
from trainyard.cli.common import fail
from trainyard.cli.render import print_json, table
from trainyard.cli.safe_text import clean
from trainyard.cli.storage import size

USAGE = "yard checkpoints JOB | yard checkpoints keep JOB STEP [--undo]"


def _int(word: str, what: str) -> int:
    if not word.isascii() or not word.isdigit() or len(word) > 18:
        fail(f"{what}: {word!r} is not a number ({USAGE})")
    return int(word)


def _metrics(m: dict) -> str:
    return " ".join(f"{clean(str(k))}={v:.6g}" for k, v in sorted(m.items()) if isinstance(v, (int, float)))[:80]


def checkpoints(words: list[str] = typer.Argument(..., metavar="JOB | keep JOB STEP", help=USAGE),
                undo: bool = typer.Option(False, "--undo", help="with keep: remove the mark"),
                as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table")) -> None:
    """A job's committed checkpoints (tiers, size, metrics, keep), or mark one keep."""
    if words[0] == "keep":
        if len(words) != 3:
            fail(f"keep takes JOB and STEP ({USAGE})")
        job, step = _int(words[1], "JOB"), _int(words[2], "STEP")
        r = Client().post(f"/api/v1/jobs/{job}/checkpoints/{step}/keep", params={"undo": undo})
        if as_json:
            print_json(r)
        else:
            typer.echo(f"job {job} step {step}: {'kept' if r['keep'] else 'no longer kept'}")
        return
    if len(words) != 1:
        fail(f"one JOB ({USAGE})")
    if undo:
        fail("--undo goes with keep")
    job = _int(words[0], "JOB")
    r = Client().get(f"/api/v1/jobs/{job}/checkpoints")
    if as_json:
        print_json(r)
        return
    table(["STEP", "TIERS", "SIZE", "FILES", "KEEP", "METRICS"],
          [[c["step"], ",".join(c["tiers"]) or "-", size(c["bytes"]), c["files"], "keep" if c["keep"] else "",
            _metrics(c["metrics"])] for c in r["checkpoints"]])
