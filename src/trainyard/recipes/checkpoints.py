"""A run's recipe next to its checkpoints, and finding the checkpoint to start from (no torch here).

`<checkpoint dir>/recipe.yaml` is the recipe the run trains with (the model actually built, after
`init_from`). It serves two purposes:
- a rerun with the same out dir resumes; one whose model, data, seed, kind or global batch differ
  is refused with the field named (loading other shapes would fail half-way, and a different data
  order would silently skip or repeat samples). Everything else may change between attempts:
  steps (to train longer), checkpoint interval, strategy (DCP reshards between DDP and FSDP2),
  learning rate, micro-batch size, logging;
- `init_from` of a later run (sft from a pretrain run, rl from an sft run) reads the model
  architecture from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from trainyard.contracts import CHECKPOINT_MARKER, JobDir, committed_steps
from trainyard.recipes.spec import RecipeError, RecipeSpec

RECIPE_FILE = "recipe.yaml"
# (field path, why it must not change across attempts of one run)
FIXED = (("kind", "the training objective"), ("seed", "the data order and initialization"),
         ("model", "the checkpointed shapes"), ("data", "the sample ids' meaning"),
         ("batch.global_batch_size", "the data position"))


def saved_recipe(checkpoint_dir: str | Path) -> dict[str, Any] | None:
    p = Path(checkpoint_dir) / RECIPE_FILE
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def _get(d: Any, path: str) -> Any:
    for part in path.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def check_compatible(saved: dict[str, Any], spec: RecipeSpec) -> None:
    """Raises RecipeError naming the first field that differs from the saved run's recipe, when
    the run has committed checkpoints to resume from."""
    now = spec.model_dump(mode="json", by_alias=True)
    for path, why in FIXED:
        old, new = _get(saved, path), _get(now, path)
        if old is None or old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            diff = [k for k in new if old.get(k, new[k]) != new[k] and (path, k) != ("data", "eval_samples")]
            if not diff:
                continue
            k = diff[0]
            raise RecipeError(f"{old.get(k)!r} in the checkpointed run, {new[k]!r} now; it fixes {why}. "
                              "Resume with the same value or use another --out", f"{path}.{k}")
        raise RecipeError(f"{old!r} in the checkpointed run, {new!r} now; it fixes {why}. "
                          "Resume with the same value or use another --out", path)


def check_resume(checkpoint_dir: str | Path, spec: RecipeSpec) -> None:
    """`check_compatible` against the recipe saved in `checkpoint_dir`, if it has checkpoints."""
    saved = saved_recipe(checkpoint_dir)
    if saved is None or not committed_steps(checkpoint_dir):
        return
    if spec.kind != "pretrain" and spec.init_from and isinstance(saved.get("model"), dict):
        # sft/rl build the init run's model, whatever the recipe's own model section says
        spec = spec.model_copy(update={"model": type(spec.model).model_validate(saved["model"])})
    check_compatible(saved, spec)


def resolve_init(source: str | Path) -> dict[str, Any]:
    """The newest complete checkpoint of a previous run: `source` is its out dir (holding
    `checkpoints/`), its checkpoint dir, or one `step-N/` directory.

    Returns {"source", "checkpoint" (the step dir), "step", "model" (its recipe's model section or
    None)}.

    Raises:
        RecipeError: no committed checkpoint there.
    """
    src = Path(source).expanduser().resolve()
    if (src / CHECKPOINT_MARKER).is_file():
        step_dir, ckpt_dir = src, src.parent
        step = int(src.name.split("-")[-1]) if src.name.startswith("step-") else 0
    else:
        ckpt_dir = JobDir(src).checkpoints if JobDir(src).checkpoints.is_dir() else src
        found = committed_steps(ckpt_dir)
        if not found:
            why = "no such directory" if not src.exists() else "no complete checkpoint (step-N/COMMITTED) there"
            raise RecipeError(f"{source}: {why}", "init_from")
        step, step_dir = found[-1]
    saved = saved_recipe(ckpt_dir)
    model = saved.get("model") if saved else None
    return {"source": str(src), "checkpoint": str(step_dir), "step": step, "model": model}


__all__ = ["FIXED", "RECIPE_FILE", "check_compatible", "check_resume", "resolve_init", "saved_recipe"]
