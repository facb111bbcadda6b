"""A run's final checkpoint as a Hugging Face model directory, with its lineage (`yard export`).

What comes out is what `AutoModelForCausalLM.from_pretrained(DIR)` and
`AutoTokenizer.from_pretrained(DIR)` load, so a model trained here goes on to inference servers,
evaluation harnesses or another framework without trainyard:

    DIR/config.json             the architecture (that of `model.from`, or the recipe's own model)
    DIR/model.safetensors       the weights of the newest complete checkpoint, float32
    DIR/generation_config.json  `model.from`'s own when it has one, else derived from the config
    DIR/tokenizer*.json …       the tokenizer files of `model.from`, as they were (training does
                                not change a tokenizer); a byte-tokenizer run has none (`tokenizer`
                                in trainyard.json says so)
    DIR/trainyard.json          lineage: recipe, kind, run dir and id, step, parent model dir,
                                data (path, sha256 of its bytes, token cache key, documents,
                                tokens), the last eval_loss logged, when, and the job's image
                                and digest when it ran in one

The weights are loaded the trainyard way (`train.load_weights`: the checkpoint's DCP model
state, whatever world size or strategy wrote it) into the architecture built without reading
the parent's weights, then saved by transformers' own `save_pretrained`, so tied embeddings and
the file layout are what transformers expects. The directory is written under a temporary name
beside DIR and renamed at the end: a failed export leaves no half-written model.

DIR must be new, empty, or a previous export of the same run (its trainyard.json names this run
dir), which the new one replaces — the newer checkpoint supersedes it; anything else is refused
before anything is read (field `--to`, or `export` for a recipe). Each export is recorded in the
user's model registry (`recipes/registry.py`, `yard models`).

A recipe's `export: DIR` (`before_training`, `after_training`, called from `train.main`): the
same export, by rank 0, of the run's final checkpoint, once the run has completed its last step
— after the runtime's blocking final save and its closing barrier, so every rank has finished
and the checkpoint is committed. A preempted attempt (exit 75) or a failed one never gets there.
A relative DIR is taken relative to the run's directory (the parent of TRAINYARD_CHECKPOINT_DIR:
`yard run`'s --out, the job's directory under the control plane), the same wherever the run
starts; rank 0 checks DIR before anything is written (exit 2 on every rank). A rerun of a
completed run whose export is already there leaves it as it is.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from trainyard.contracts import CHECKPOINT_MARKER, EXPORTS_DIR, JobDir, JobVar, committed_steps
from trainyard.recipes.checkpoints import resolve_init, saved_recipe
from trainyard.recipes.registry import LINEAGE
from trainyard.recipes.spec import RecipeError, RecipeSpec

INIT_FILE = "init_from.json"
RUN_OWN = ("checkpoints", "metrics", "logs")
BYTE_TOKENIZER = "bytes (trainyard: byte t < 256, PAD 256, BOS 257, EOS 258); no Hugging Face tokenizer"


def locate(run: Path) -> tuple[Path, Path]:
    """(run dir, checkpoint dir) of a run's out dir, its checkpoint dir or one `step-N/` in it.
    The run dir is the checkpoint dir's parent (JobDir's layout: `<run>/checkpoints/`)."""
    if (run / CHECKPOINT_MARKER).is_file():
        ckpt = run.parent
    elif JobDir(run).checkpoints.is_dir():
        ckpt = JobDir(run).checkpoints
    else:
        ckpt = run
    return ckpt.parent, ckpt


def _last_eval_loss(metrics_dir: Path | None, step: int) -> float | None:
    if metrics_dir is None:
        return None
    try:
        lines = (metrics_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return None
    found = None
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and "eval_loss" in r and r.get("step", 0) <= step:
            found = r["eval_loss"]
    return found


def _data_lineage(step_dir: Path, ckpt_dir: Path, spec: RecipeSpec) -> dict[str, Any]:
    """The data the run trained on, from its checkpoint's data fingerprint and token cache record."""
    import torch

    out: dict[str, Any] = {"path": spec.data.path, "source": None if spec.data.path else spec.data.source}
    try:
        state = torch.load(step_dir / "rank-0.pt", weights_only=False, map_location="cpu")
        fp = state["state"]["data"]
        out.update(description=fp["description"], fingerprint=fp["digest"])
    except (OSError, KeyError, TypeError, RuntimeError):
        return out
    try:
        meta = json.loads((ckpt_dir / "tokens" / f"{fp['digest']}.json").read_text())
        out.update(sha256=meta["data_fingerprint"], field=meta["field"], documents=meta["documents"],
                   tokens=meta["tokens"], tokenizer=meta["tokenizer"])
    except (OSError, ValueError, KeyError):
        pass
    return out


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _writable_ancestor(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_target(dest: Path, run_dir: Path | None, field: str = "--to") -> None:
    """Refuse an export directory that cannot be written, or whose contents it would destroy.

    Raises:
        RecipeError(field): `dest` is the run's own directory (or holds it, or lies in its
            checkpoints/, metrics/, logs/); exists and is not a directory; is not empty and not a
            previous export of this run; or cannot be created or replaced (permissions).
    """
    dest = Path(dest)
    if run_dir is not None:
        run_dir = Path(run_dir)
        inside = run_dir in dest.parents and dest.relative_to(run_dir).parts[0] in RUN_OWN
        if dest == run_dir or dest in run_dir.parents or inside:
            raise RecipeError(f"{dest} is (or holds) the run's own directory {run_dir} or its "
                              f"{'/'.join(RUN_OWN)}; export into a directory of its own", field)
    if dest.exists() or dest.is_symlink():
        if not dest.is_dir():
            raise RecipeError(f"{dest} exists and is not a directory", field)
        try:
            full = any(dest.iterdir())
        except OSError as e:
            raise RecipeError(f"{dest}: {e.strerror or e}", field) from None
        if full:
            prev = _read_json(dest / LINEAGE)
            if prev is None or run_dir is None or prev.get("run") != str(run_dir):
                raise RecipeError(f"{dest} exists and is not empty (and is not an export of this run); "
                                  "export into a new directory", field)
    # the model is written beside dest and renamed into place: dest's parent must be writable
    anc = _writable_ancestor(dest.parent)
    if not anc.is_dir():
        raise RecipeError(f"{anc} is not a directory; cannot create {dest}", field)
    if not os.access(anc, os.W_OK | os.X_OK):
        raise RecipeError(f"{anc} is not writable (by uid {os.geteuid()}); cannot create {dest}", field)


def _parent_run(ckpt_dir: Path) -> dict[str, Any] | None:
    info = _read_json(ckpt_dir / INIT_FILE)
    if info is None:
        return None
    return {"run": info.get("source"), "checkpoint": info.get("checkpoint"), "step": info.get("step")}


def image_lineage(via: str) -> dict[str, str | None]:
    """The image the run's job ran in and its digest, from the job's environment (`JobVar.IMAGE`,
    `JobVar.IMAGE_DIGEST`, set by the launch of a job in an image); None for a bare job, and for
    `yard export` from a shell, whose environment is not the job's."""
    env = os.environ if via == "recipe" else {}
    return {"image": env.get(JobVar.IMAGE) or None, "image_digest": env.get(JobVar.IMAGE_DIGEST) or None}


def export_run(run: str | Path, to: str | Path, *, field: str = "--to", metrics_dir: Path | None = None,
               via: str = "yard export") -> dict[str, Any]:
    """Write the newest complete checkpoint of `run` to `to` in HF format; its lineage record.

    `run`: an out dir, its checkpoint dir or one `step-N/`. `metrics_dir`: where metrics.jsonl is
    (default `<run dir>/metrics`), for the last eval_loss.

    Raises:
        RecipeError: `to` is refused by `check_target` (field `field`), no complete checkpoint
            (field `RUN`), or no recipe.yaml beside it.
    """
    run = Path(run).expanduser().resolve()
    dest = Path(to).expanduser().resolve()
    run_dir, ckpt_dir = locate(run)
    check_target(dest, run_dir if run.exists() else None, field)
    try:
        found = resolve_init(run)
    except RecipeError as e:
        raise RecipeError(e.message, "RUN") from None
    saved = saved_recipe(ckpt_dir)
    if saved is None:
        raise RecipeError(f"{ckpt_dir}: no recipe.yaml (not a trainyard recipe run)", "RUN")
    spec = RecipeSpec.model_validate(saved)
    if metrics_dir is None and JobDir(run_dir).metrics_dir.is_dir():
        metrics_dir = JobDir(run_dir).metrics_dir

    from transformers import GenerationConfig

    from trainyard.recipes.models import build_model
    from trainyard.recipes.train import load_weights

    step_dir = Path(found["checkpoint"])
    model = build_model(spec.model, load_weights=False)
    load_weights(model, step_dir)
    model.config.use_cache = True  # trained without a KV cache; inference wants one
    parent = spec.model.from_

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.export-{os.getpid()}")
    old = dest.with_name(f".{dest.name}.replaced-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # "Writing model shards" bars in a rank's log and the CLI's output
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.save_pretrained(tmp, safe_serialization=True)
        if parent is not None and (Path(parent) / "generation_config.json").is_file():
            gen = GenerationConfig.from_pretrained(parent, local_files_only=True)
        else:
            gen = GenerationConfig.from_model_config(model.config)
        gen.save_pretrained(tmp)
        tokenizer = BYTE_TOKENIZER
        if parent is not None:
            from trainyard.recipes.hf_checkpoint import inspect

            info = inspect(parent)
            for f in info.tokenizer_files:
                shutil.copy2(f, tmp / f.name)
            tokenizer = f"{parent} ({', '.join(f.name for f in info.tokenizer_files)})"
        lineage = {
            "format": "trainyard-export-v1",
            "run": str(run_dir),
            "run_id": run_dir.name,
            "job_id": os.environ.get(JobVar.JOB_ID) if via == "recipe" else None,
            "recipe": spec.name,
            "kind": spec.kind,
            "step": found["step"],
            "steps": spec.steps,
            "checkpoint": str(step_dir),
            "parent_model": parent,
            "parent_run": _parent_run(ckpt_dir),
            "model_type": model.config.model_type,
            "parameters": sum(p.numel() for p in model.parameters()),
            "tokenizer": tokenizer,
            "hf_tokenizer": parent is not None,
            "data": _data_lineage(step_dir, ckpt_dir, spec),
            "final_eval_loss": _last_eval_loss(metrics_dir, found["step"]),
            "seed": spec.seed,
            **image_lineage(via),
            "exported_by": via,
            "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (tmp / LINEAGE).write_text(json.dumps(lineage, indent=1) + "\n")
        check_target(dest, run_dir, field)  # again: something may have appeared there meanwhile
        if dest.is_dir() and any(dest.iterdir()):
            os.replace(dest, old)  # a previous export of this run (checked): replaced
        elif dest.exists():
            dest.rmdir()  # empty
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not dest.exists():
            os.replace(old, dest)  # put the previous export back
        raise
    shutil.rmtree(old, ignore_errors=True)
    return lineage


# -- a recipe's `export:` (called by train.main) ------------------------------------------------------------


def recipe_target(spec: RecipeSpec, checkpoint_dir: str | Path) -> Path | None:
    """Where the recipe's `export` goes: absolute (or ~) as given, else relative to the run dir,
    which under a control plane (TRAINYARD_JOB_ID) is the job dir's `exports/`: the job dir itself
    is the plane's, and the job's owner may write in `exports/` only (contracts.JobDir)."""
    if spec.export is None:
        return None
    p = Path(spec.export).expanduser()
    run_dir = Path(checkpoint_dir).expanduser().resolve().parent
    base = run_dir / EXPORTS_DIR if os.environ.get(JobVar.JOB_ID) and (run_dir / EXPORTS_DIR).is_dir() \
        else run_dir
    return (p if p.is_absolute() else base / p).resolve()


def check_recipe_target(spec: RecipeSpec, checkpoint_dir: str | Path) -> Path | None:
    """`recipe_target`, checked (`check_target`, field `export`). Raises RecipeError."""
    dest = recipe_target(spec, checkpoint_dir)
    if dest is not None:
        check_target(dest, Path(checkpoint_dir).expanduser().resolve().parent, "export")
    return dest


def before_training(spec: RecipeSpec, ctx: Any) -> Path | None:
    """Rank 0 checks the export directory before anything is written; every rank gets the
    outcome, so all exit 2 on a bad one. Collective when distributed."""
    if spec.export is None:
        return None
    error, dest = None, recipe_target(spec, ctx.env.checkpoint_dir)
    if ctx.rank == 0:
        try:
            check_recipe_target(spec, ctx.env.checkpoint_dir)
        except RecipeError as e:
            error = (e.message, e.field)
    if ctx.distributed:
        import torch.distributed as dist

        box = [error]
        dist.broadcast_object_list(box, src=0, group=ctx.control_group)
        error = box[0]
    if error is not None:
        raise RecipeError(*error)
    return dest


def _say(msg: str) -> None:
    print(f"trainyard.recipes: {msg}", file=sys.stderr, flush=True)


def after_training(spec: RecipeSpec, ctx: Any, dest: Path | None) -> dict[str, Any] | None:
    """Rank 0: export the run's final checkpoint to `dest` and record it in the registry.

    Called once the run has completed its last step (`Run.steps` returned: the final checkpoint
    is committed and every rank has passed the closing barrier). A completed run's rerun whose
    export of that checkpoint is already there keeps it.

    Raises:
        RecipeError: `dest` became unusable during the run (field `export`; the message says how
            to export the committed checkpoint by hand).
    """
    if dest is None or ctx.rank != 0:
        return None
    from trainyard.recipes.registry import register

    ckpt_dir = Path(ctx.env.checkpoint_dir).expanduser().resolve()
    run_dir = ckpt_dir.parent
    found = committed_steps(ckpt_dir)
    if not found:
        raise RecipeError(f"no committed checkpoint in {ckpt_dir} to export", "export")
    step, step_dir = found[-1]
    prev = _read_json(dest / LINEAGE)
    if prev is not None and prev.get("run") == str(run_dir) and prev.get("checkpoint") == str(step_dir):
        _say(f"export: {dest} already holds step {step} of this run; left as it is")
        lineage = prev
    else:
        try:
            lineage = export_run(ckpt_dir, dest, field="export", metrics_dir=Path(ctx.env.metrics_dir),
                                 via="recipe")
        except RecipeError as e:
            raise RecipeError(f"{e.message} (the training finished and step {step} is committed: "
                              f"`yard export {run_dir} --to DIR` exports it)", "export") from None
        tok = "" if lineage["hf_tokenizer"] else "; no Hugging Face tokenizer (the run used the byte tokenizer)"
        _say(f"exported step {lineage['step']} ({lineage['model_type']}, {lineage['parameters']:,} parameters) "
             f"to {dest}{tok}")
    _name, note = register(dest, lineage, run_dir=run_dir)
    _say(note)
    return lineage


__all__ = ["LINEAGE", "after_training", "before_training", "check_recipe_target", "check_target", "export_run",
           "locate", "recipe_target"]
