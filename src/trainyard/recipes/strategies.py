"""Parallelism strategies: `ddp` (DistributedDataParallel) and `fsdp2` (`fully_shard`).

Both are data parallel: every rank takes its slice of the global batch (from the runtime's
`ResumableSampler`) and gradients are averaged over the ranks, so a recipe's results do not
depend on which one it uses beyond floating-point order. The difference is memory: DDP keeps a
full copy of parameters, gradients and optimizer state on every rank; FSDP2 shards all three over
the ranks and gathers a block's parameters just before it runs (each decoder layer is its own
unit, the embeddings and output head are the root's), like torchtitan does.

With one process neither wrapper is applied: the plain module trains the same way, and its
checkpoints load on any number of processes (DCP reshards).

`no_sync(model, sync)`: gradient accumulation over micro-batches without an all-reduce (DDP) or
reduce-scatter (FSDP2) after each one; only the last micro-batch of a step synchronizes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from trainyard.recipes.models import decoder_layers

STRATEGIES = ("ddp", "fsdp2")


def wrap(model: torch.nn.Module, strategy: str, device: torch.device, *, bf16: bool = False,
         find_unused: bool = True) -> torch.nn.Module:
    """The model ready for data-parallel training under `strategy` (unchanged in one process)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        # find_unused_parameters=True (the caller decides: deterministic runs on > 2 ranks), for exact
        # resumes: without it DDP puts every gradient in one
        # bucket for its first step and rebuilds the buckets in gradient-ready order after it. With
        # more than two ranks the ring all-reduce's summation order depends on a gradient's place
        # in its bucket, so the first step after a resume was summed differently from the same
        # step of an uninterrupted run (last-bit differences on 8 ranks). With it, the buckets
        # keep their construction-time layout at every step of every attempt. The price is one
        # walk of the autograd graph per step. With two ranks a sum of two is the same either way.
        return DDP(model, device_ids=[device] if device.type == "cuda" else None, find_unused_parameters=find_unused)
    return shard_fsdp2(model, device, bf16=bf16)


def shard_fsdp2(model: torch.nn.Module, device: torch.device, *, bf16: bool = False) -> torch.nn.Module:
    """`fully_shard` each decoder layer, then the root (embeddings, final norm, output head), over
    all ranks; on a model whose parameters are on the meta device too (`sharded_start`)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    kwargs: dict[str, Any] = {"mesh": mesh}
    if bf16:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module to call for generation (DDP's inner module; an FSDP2 module is itself)."""
    return getattr(model, "module", model)


@contextlib.contextmanager
def no_sync(model: torch.nn.Module, sync: bool) -> Iterator[None]:
    """Within: backward accumulates gradients locally unless `sync` (the step's last micro-batch)."""
    if sync:
        yield
        return
    ddp_no_sync = getattr(model, "no_sync", None)  # DDP
    if ddp_no_sync is not None:
        with ddp_no_sync():
            yield
        return
    set_sync = getattr(model, "set_requires_gradient_sync", None)  # FSDP2
    if set_sync is not None:
        set_sync(False)
        try:
            yield
        finally:
            set_sync(True)
        return
    yield


__all__ = ["STRATEGIES", "no_sync", "shard_fsdp2", "unwrap", "wrap"]
