"""`yard run RECIPE --nproc N --out DIR [--set key=value …]`: train a recipe on this machine.

RECIPE is a shipped recipe (`llama-pretrain`, `gemma-pretrain`, `sft`, `rl`) or a YAML file.
The recipe is validated here first (bad input: one line `error: …` naming the field, exit 2);
then N ranks start (`trainyard.recipes.launch`) with DIR/checkpoints, DIR/metrics and DIR/logs.
With `model.from` (a Hugging Face checkpoint) or `data.path` (the user's data) the directory and
every data file are checked here too, so a missing config.json or a JSON line without the text
field fails before anything is written to DIR.
A recipe's `export: DIR` (relative to DIR) is checked here as well; the ranks export at the end.
Running the same command again with the same DIR resumes from the newest complete checkpoint.
SIGUSR1 or SIGTERM (and the first Ctrl-C) make every rank checkpoint and stop: exit 75.
`--container-image` and `--dataset` are checked as `yard submit`'s and refused for now, naming the way
that works (`yard submit --recipe … --container-image …`): the ranks here are this machine's processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trainyard.cli.common import fail
from trainyard.contracts import JobDir


def run(
    recipe: str = typer.Argument(..., help="a shipped recipe (llama-pretrain, gemma-pretrain, sft, rl) or a YAML file"),
    nproc: int = typer.Option(1, "--nproc", "-n", help="processes (ranks) to start on this machine"),
    out: Path = typer.Option(..., "--out", "-o", help="run directory: checkpoints/, metrics/, logs/; reuse it to resume"),
    sets: list[str] = typer.Option([], "--set", help="override a recipe field: KEY=VALUE, dotted keys "
                                                      "(model.hidden_size=64); repeatable"),
    image: Optional[str] = typer.Option(None, "--container-image", help="as yard submit's (pyxis's): not yet on "
                                        "this machine without a plane; use yard submit --recipe"),
    dataset: list[str] = typer.Option([], "--dataset", help="as yard submit's: the catalogue's datasets are staged "
                                      "by a plane; here, point the recipe at the data (--set data.path=...)"),
) -> None:
    """Train a recipe locally with N processes; rerun with the same --out to resume."""
    if dataset:
        from trainyard.cli.dataset_opts import parse_all

        try:
            parse_all(dataset)
        except ValueError as e:
            fail(str(e))
        fail("--dataset: yard run starts the ranks on this machine without a control plane, which stages the "
             "catalogue's datasets; submit the recipe instead (yard submit --recipe RECIPE --dataset "
             f"{','.join(dataset)}), or give the data's path (--set data.path=PATH)")
    if image is not None:
        from trainyard.cli.container_opts import value

        try:
            value("--container-image", image)
        except ValueError as e:
            fail(str(e))
        # the ranks would run through the node's image cache and runc, which yard run (no plane) has not yet
        fail("--container-image: yard run starts the ranks on this machine without a control plane and does not "
             "run images yet; submit the recipe in the image instead: yard submit --recipe RECIPE "
             "--container-image IMAGE")
    from trainyard.recipes.checkpoints import check_resume, resolve_init
    from trainyard.recipes.spec import RecipeError, absolute_paths, load_recipe, recipe_path, shipped

    if nproc < 1:
        fail(f"--nproc: must be at least 1, got {nproc}")
    try:
        ref = recipe if recipe in shipped() else str(recipe_path(recipe))  # a file: its absolute path
        spec = load_recipe(ref, sets)
        spec.check_world_size(nproc)
        sets = list(sets)
        if spec.init_from:
            resolve_init(str(Path(spec.init_from).expanduser().resolve()))  # a missing source fails here
        sets += absolute_paths(spec)  # the ranks' record: absolute
        spec = load_recipe(ref, sets)
        if spec.model.from_ is not None:
            from trainyard.recipes.hf_checkpoint import inspect

            inspect(spec.model.from_)  # the directory's files and model_type, before anything starts
        if spec.data.path is not None:
            from trainyard.recipes.user_data import check_recipe

            check_recipe(spec)  # every file and line, before anything is written to --out
        check_resume(JobDir(out).checkpoints, spec)
        if spec.export is not None:
            from trainyard.recipes.export import check_recipe_target

            check_recipe_target(spec, JobDir(out.resolve()).checkpoints)  # `export:` before anything starts
    except RecipeError as e:
        fail(str(e))
    if out.exists() and not out.is_dir():
        fail(f"--out: {out} exists and is not a directory")
    from trainyard.recipes.launch import launch

    raise typer.Exit(launch(ref, sets, nproc, out))
