"""FSDP2's start without a whole model on any rank: build on the meta device, shard, load each rank's rows.

Building the model whole on every rank and sharding it afterwards needs the full fp32 model in each
rank's memory for a moment: a model larger than one rank's memory could never start. Here (as
torchtitan does) the architecture is built with its parameters on the meta device (shapes only),
`fully_shard` is applied per decoder layer and to the root, the shards are allocated
(`to_empty`), and each rank fills its own rows:

- from a Hugging Face checkpoint (`model.from`, first attempt): each parameter's rows of this rank
  are read from the safetensors with `safe_open(...).get_slice` (only those bytes are read) and
  converted to float32 one tensor at a time;
- from a trainyard run (`init_from`, first attempt): its checkpoint's weights through DCP, each
  rank reading its own shards (`load_dcp_shards`);
- resuming: nothing is read here, the runtime loads the run's own sharded checkpoint (DCP) over
  the shards before the first step.

Buffers are not parameters: RoPE's `inv_freq` is computed at construction and saved in no
checkpoint, so the architecture is built with real buffers (`params_on_meta`) and they are put
back after `to_empty`. Peak memory per rank at start is its shard plus one tensor's rows in
transit (tests/recipes/test_sharded_start.py measures it).

Random initialization (no checkpoint to read) keeps the whole-model start: its values must be
those a single process draws, and the recipes' random models are small.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from trainyard.recipes.hf_checkpoint import WEIGHTS_INDEX, inspect
from trainyard.recipes.spec import ModelSpec, RecipeError

if TYPE_CHECKING:  # transformers loads only where a model is built
    from transformers import PreTrainedModel


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Parameters registered inside go to the meta device at once; buffers stay where they are made.

    A parameter's tensor is created by its module (`torch.empty`, untouched memory) and replaced by
    a meta tensor of the same shape before the module initializes it, so no parameter ever holds
    real memory and the initializers run on meta tensors (free).
    """
    original = torch.nn.Module.register_parameter

    def register(self: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        original(self, name, param)

    torch.nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original  # type: ignore[method-assign]


def shard_rows(n: int, rank: int, world: int) -> tuple[int, int]:
    """The rows [start, stop) of dim 0 that FSDP2 gives `rank` (torch.chunk's split)."""
    chunk = -(-n // world)
    start = min(rank * chunk, n)
    return start, min(start + chunk, n)


def _weight_files(directory: Path) -> dict[str, Path]:
    """Checkpoint key -> the safetensors file that holds it."""
    index = directory / WEIGHTS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {k: directory / v for k, v in weight_map.items()}
    from safetensors import safe_open

    single = inspect(directory).weight_files[0]
    with safe_open(str(single), framework="pt") as f:
        return {k: single for k in f.keys()}


def _checkpoint_key(name: str, keys: dict[str, Path]) -> str | None:
    """The checkpoint's key for a parameter (some checkpoints omit the base model's prefix)."""
    for candidate in (name, name.removeprefix("model."), f"model.{name}"):
        if candidate in keys:
            return candidate
    return None


def load_hf_shards(model: torch.nn.Module, directory: str | Path) -> int:
    """Fill each sharded parameter's local rows from the checkpoint's safetensors; bytes read.

    Raises:
        RecipeError (model.from): a parameter the checkpoint does not have (a tied output head
            shares the embedding's storage and is skipped), or a shape that differs.
    """
    from safetensors import safe_open

    d = Path(directory)
    keys = _weight_files(d)
    rank, world = dist.get_rank(), dist.get_world_size()
    handles: dict[Path, Any] = {}
    seen: set[int] = set()
    read = 0
    try:
        with torch.no_grad():
            for name, param in model.named_parameters():
                local = param.to_local() if hasattr(param, "to_local") else param
                if id(param) in seen:
                    continue
                seen.add(id(param))
                key = _checkpoint_key(name, keys)
                if key is None:
                    raise RecipeError(f"{d}: the checkpoint has no weight {name!r}", "model.from")
                f = handles.get(keys[key])
                if f is None:
                    f = handles[keys[key]] = safe_open(str(keys[key]), framework="pt").__enter__()
                sl = f.get_slice(key)
                shape = tuple(sl.get_shape())
                if shape != tuple(param.shape):
                    raise RecipeError(f"{keys[key]}: {key} has shape {list(shape)}, the model's is "
                                      f"{list(param.shape)}", "model.from")
                start, stop = shard_rows(shape[0], rank, world) if hasattr(param, "to_local") else (0, shape[0])
                if local.shape[0] != stop - start:  # FSDP2 splits dim 0 as torch.chunk does; anything else is a bug
                    raise RuntimeError(f"{name}: local shard has {local.shape[0]} rows, expected {stop - start}")
                rows = sl[start:stop]
                local.copy_(rows.to(dtype=local.dtype))
                read += rows.numel() * rows.element_size()
                del rows
    finally:
        for f in handles.values():
            f.__exit__(None, None, None)
    return read


def load_dcp_shards(model: torch.nn.Module, step_dir: str | Path) -> None:
    """The weights (only) of a committed trainyard checkpoint into the sharded model: each rank
    reads its shards through DCP's planner (the checkpoint may have been written at any world
    size). Optimizer state, schedule and data position are not taken (a fine-tuning run starts
    its own), as `train.load_weights` does for a whole model."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=str(step_dir))
    set_model_state_dict(model, state["model"])


def build_sharded(spec: ModelSpec, device: torch.device, *, load_checkpoint: bool,
                  shard: Any) -> PreTrainedModel:
    """The model of `spec` sharded by `shard(model)` (FSDP2), its shards on `device`.

    `load_checkpoint`: fill them from the safetensors of `model.from`; else they are left uninitialized
    for the caller to load a checkpoint over (a resumed run).
    """
    from trainyard.recipes.models import build_model

    with params_on_meta():
        model = build_model(spec, load_weights=False)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    shard(model)
    model.to_empty(device=device)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name].to(device))
    if load_checkpoint:
        assert spec.from_ is not None
        load_hf_shards(model, spec.from_)
    return model


__all__ = ["build_sharded", "load_dcp_shards", "load_hf_shards", "params_on_meta", "shard_rows"]
