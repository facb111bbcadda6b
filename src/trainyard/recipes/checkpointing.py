"""Activation checkpointing of the decoder layers: `none`, `selective` or `full` (`activation_checkpoint`).

Backward needs what the forward computed; storing all of it is the largest part of a step's memory
at long sequences (`yard plan memory`). Recomputing trades compute for that memory, per decoder
layer, as torchtitan does:

- `full`: a layer keeps only its input; its whole forward runs again in backward (about a third
  more compute for the layers);
- `selective`: torchtitan's op-level policy — the outputs of the attention kernel and of every
  other matrix multiply in the layer are kept, the rest (norms, activations, RoPE, the other
  half of the matmuls) is recomputed: most of the memory back for a few percent of compute;
- `none`: nothing is recomputed.

Implemented by replacing each layer's `forward` on the instance with a checkpointed call of the
original (`torch.utils.checkpoint`, non-reentrant; `selective` with
`create_selective_checkpoint_contexts`). The modules and their parameter names are unchanged, so
checkpoints, `yard export` and a resume with another mode are unaffected, and FSDP2's hooks
(on the module's `__call__`) still gather the layer's parameters before its forward and its
backward — the recomputation happens inside the backward. Recomputation is deterministic here:
the forward runs the same kernels on the same inputs, and dropout (none in the recipes' models)
would replay its RNG state (`preserve_rng_state`).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from trainyard.recipes.models import decoder_layers

MODES = ("none", "selective", "full")


def _attention_ops() -> set[Any]:
    """The fused attention kernels whose outputs are kept (what exists in this PyTorch build)."""
    aten = torch.ops.aten
    names = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
    return {getattr(aten, n).default for n in names if hasattr(aten, n)}


def _selective_context() -> tuple[Any, Any]:
    """torchtitan's op-level policy: keep attention outputs and every other mm's output."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    keep = _attention_ops()
    mm = torch.ops.aten.mm.default
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func == mm:
            key = "recompute" if ctx.is_recompute else "forward"
            counts[key] += 1
            # the count restarts for each layer's forward and again for its recomputation
            return CheckpointPolicy.MUST_SAVE if counts[key] % 2 == 1 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _checkpointed(forward: Callable[..., Any], mode: str) -> Callable[..., Any]:
    from torch.utils.checkpoint import checkpoint

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # evaluation, generation: nothing to save
            return forward(*args, **kwargs)
        extra: dict[str, Any] = {"context_fn": _selective_context} if mode == "selective" else {}
        return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True, **extra, **kwargs)

    return run


def apply(model: torch.nn.Module, mode: str) -> int:
    """Checkpoint every decoder layer of `model` in `mode`; the number of layers wrapped."""
    if mode not in MODES:
        raise ValueError(f"activation checkpointing {mode!r} is not one of {', '.join(MODES)}")
    if mode == "none":
        return 0
    layers = decoder_layers(model)
    for layer in layers:
        layer.forward = _checkpointed(layer.forward, mode)  # the bound original; modules stay as they are
    return len(layers)


__all__ = ["MODES", "apply"]
