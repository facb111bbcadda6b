"""`yard export RUN [--to DIR] [--name NAME]`: a recipe run's final checkpoint as a Hugging Face model.

RUN is a `yard run` out dir (or its checkpoints/ dir, or one step-N/ in it); the newest complete
checkpoint is exported (`trainyard.recipes.export`): config.json, safetensors,
generation_config.json, the tokenizer of the run's `model.from`, and trainyard.json with the
lineage (recipe, run, step, parent model, data fingerprint). `AutoModelForCausalLM.from_pretrained(DIR)`
loads it. Without --to the model goes to `<data dir>/models/<NAME>` (NAME: --name, else the run's
id, or `<id>-2`, … when that is another directory's name). Every export is recorded in the user's model registry (`recipes/registry.py`), which
`yard models` lists. Bad input (no checkpoint, a non-empty DIR that is not an export of this run,
a name already used for another directory): one line `error: …`, exit 2, nothing written.

(`cli/export.py` is another thing: sbatch's `--export` of environment variables.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from trainyard.cli.common import fail

DATA_DIR_HELP = "whose model registry (models/) to record the export in (default: $YARD_DATA_DIR or ~/.trainyard)"


def export(
    run: Path = typer.Argument(..., help="a `yard run` out dir (or its checkpoints/ dir)"),
    to: Optional[Path] = typer.Option(None, "--to", help="the directory to write (new, empty, or a previous export "
                                                         "of this run); default <data dir>/models/NAME"),
    name: Optional[str] = typer.Option(None, "--name", help="the model's name in the registry (default: the "
                                                            "directory's name, or the run's)"),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
    as_json: bool = typer.Option(False, "--json", help="print the lineage record as JSON"),
) -> None:
    """Export a run's final checkpoint as a Hugging Face model (from_pretrained loads it)."""
    from trainyard.recipes.registry import check_name, default_dest, name_for, register, registry_dir, unwritable
    from trainyard.recipes.spec import RecipeError

    try:
        if name is not None:
            check_name(name)
        from trainyard.recipes.export import export_run, locate

        run_dir, _ = locate(run.expanduser().resolve())
        if to is None and (why := unwritable(registry_dir(data_dir), create=False)) is not None:
            fail(f"--to: not given, and the model registry cannot take the model: {why}; give --to DIR")
        dest = (to.expanduser() if to is not None else default_dest(run_dir, name=name, data=data_dir)).resolve()
        if name is not None:
            name_for(dest, name=name, run_dir=run_dir, data=data_dir)  # taken by another directory: refused now
        lineage = export_run(run, dest)
    except RecipeError as e:
        fail(str(e))
    except ImportError as e:
        fail(f"yard export needs trainyard[train] (torch, transformers): {e}")
    registered, note = register(dest, lineage, name=name, run_dir=run_dir, data=data_dir)
    if as_json:
        typer.echo(json.dumps(lineage, indent=1))  # the lineage record as written (the registry: on stderr)
    else:
        typer.echo(f"exported {lineage['recipe']} step {lineage['step']} ({lineage['model_type']}, "
                   f"{lineage['parameters']:,} parameters) to {dest}")
    if not lineage["hf_tokenizer"]:
        typer.echo("note: no Hugging Face tokenizer: the run used trainyard's byte tokenizer (token t < 256 is "
                   "byte t; PAD 256, BOS 257, EOS 258)", err=True)
    typer.echo(note if registered else f"note: {note}", err=True)
