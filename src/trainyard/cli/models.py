"""`yard models [NAME] [--json] [--data-dir DIR]`: the exported models of the data dir, with their lineage.

Reads the user's model registry (`<data dir>/models/`, `recipes/registry.py`), which every export
— `yard export`, a recipe's `export:` — records itself in. One row per model:

    NAME  STATE  KIND  RECIPE  STEP  EVAL LOSS  PARENT  RUN  EXPORTED  PATH

STATE is `ok`, `missing` (the directory or its trainyard.json is gone: the row shows what the
record remembers), `unreadable` (permissions) or `damaged` (a record or trainyard.json that does
not parse). PARENT is the registry name of the Hugging Face checkpoint the run started from
when that is itself a registered export, else its path (`model.from`), else the run an sft/rl
recipe started from (`init_from`); `-` for a run from random weights. With NAME: that model's
whole lineage record. `--json`: the entries as JSON (name, path, state, record, lineage), never
cleaned. Bad input (an unknown NAME, a --data-dir that is a file): `error: …`, exit 2.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import typer

from trainyard.cli.common import fail

DATA_DIR_HELP = "the data dir whose models/ to list (default: $YARD_DATA_DIR or ~/.trainyard)"
HEADERS = ("NAME", "STATE", "KIND", "RECIPE", "STEP", "EVAL LOSS", "PARENT", "RUN", "EXPORTED", "PATH")


def _home(p: Any) -> str:
    if not p:
        return ""
    home = str(Path.home())
    s = str(p)
    return "~" + s[len(home):] if home != "/" and (s == home or s.startswith(home + os.sep)) else s


def _parent(lineage: dict[str, Any], by_path: dict[str, str]) -> str:
    pm = lineage.get("parent_model")
    if pm:
        return by_path.get(str(pm), _home(pm))
    pr = lineage.get("parent_run")
    if isinstance(pr, dict) and pr.get("run"):
        return f"run {_home(pr['run'])}" + (f" step {pr['step']}" if pr.get("step") is not None else "")
    return "-"


def _row(e: dict[str, Any], by_path: dict[str, str]) -> list[str]:
    lin = e["lineage"] or {}
    step = lin.get("step")
    steps = lin.get("steps")
    loss = lin.get("final_eval_loss")
    run = lin.get("run_id") or ""
    if lin.get("job_id"):
        run = f"{run} (job {lin['job_id']})"
    exported = str(lin.get("exported_at") or "")[:16].replace("T", " ")
    return [e["name"], e["state"], str(lin.get("kind") or ""), str(lin.get("recipe") or ""),
            "" if step is None else (f"{step}/{steps}" if steps not in (None, step) else str(step)),
            "" if not isinstance(loss, (int, float)) else f"{loss:.4g}", _parent(lin, by_path) if lin else "",
            run, exported, _home(e["path"] or e["record"])]


def models(
    name: Optional[str] = typer.Argument(None, help="one model: its whole lineage"),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
    as_json: bool = typer.Option(False, "--json", help="the entries as JSON"),
) -> None:
    """List the exported models of the data dir (every `yard export` and recipe `export:`) with their lineage."""
    from trainyard.cli.render import table
    from trainyard.cli.safe_text import clean
    from trainyard.recipes.registry import data_dir as resolve, entries, registry_dir

    root = resolve(data_dir)
    if root.exists() and not root.is_dir():
        fail(f"--data-dir: {root} is not a directory")
    reg = registry_dir(data_dir)
    if reg.exists() and not reg.is_dir():
        fail(f"--data-dir: {reg} is not a directory")
    found = entries(data_dir)
    if name is not None:
        match = [e for e in found if e["name"] == name]
        if not match:
            known = ", ".join(e["name"] for e in found[:20]) or "none"
            fail(f"NAME: no model {clean(name)!r} in {reg}; known: {clean(known)}")
        found = match
    if as_json:
        typer.echo(json.dumps(found[0] if name is not None else found, indent=1))
        return
    if name is not None:
        e = found[0]
        typer.echo(f"{clean(e['name'])}: {e['state']}, {clean(e['path'])}")
        if e["record"]:
            typer.echo(f"  record: {clean(e['record'])}")
        for k, v in (e["lineage"] or {}).items():
            text = json.dumps(v) if isinstance(v, (dict, list)) else str(v)
            typer.echo(f"  {k}: {clean(text)}")
        return
    if not found:
        typer.echo(f"no exported models in {clean(reg)} (`yard export RUN` or a recipe's `export:` records them)")
        return
    by_path = {e["path"]: e["name"] for e in found if e["path"]}
    table(HEADERS, [_row(e, by_path) for e in found])
