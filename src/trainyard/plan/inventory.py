"""Activation memory of a decoder layer as the recipes run it: every tensor autograd keeps, counted.

The paper formulas (Korthikanti et al. 2022, `memory.activation_bytes_per_layer`) describe
Megatron's GPT layer: a 4h GeLU MLP, dropout masks, and attention scores stored unless the
attention core is recomputed. The recipes (and torchtitan) run Llama-family layers under PyTorch's
SDPA, which never stores the s² scores, with no dropout, a gated MLP of any width and grouped-query
attention. This module counts, per token of a micro-batch, the tensors such a layer saves for its
backward pass, and the transient memory of the moments where a step peaks. Each count was checked
against PyTorch's own accounting of live tensors (`torch.distributed._tools.mem_tracker`) on real
steps of the recipes' models (bench/memory_planner.py, docs/memory-planner.md).

Per token, h the hidden size, q = heads × head_dim, k = kv_heads × head_dim, f the MLP width, all
in the activation dtype (e bytes: 4 in fp32, 2 in bf16/fp16), t the tensor-parallel degree
(replicated terms divided by t only with sequence parallelism):

    recompute none       each RMSNorm: its input, the normalized tensor and its output (3h, two
                         norms: 6h; LayerNorm keeps 2h); Q (q), K and V (2k; SDPA takes GQA as
                         it is, without repeating K and V), the attention output (q; the output
                         projection reads the same storage); gated MLP: gate and up projections,
                         the activation and the product (4f; a 2-matrix MLP: 2f); the softmax
                         log-sum-exp (4 bytes per head) and the norms' 1/rms (4 bytes each)
    recompute selective  torchtitan's op-level policy: the layer input (h), the outputs of every
                         other matmul in order — Q (q), V (k), the first MLP projection (f), the
                         down projection (h) — and the attention output (q)
    recompute full       the layer input (h)
    eager attention      adds the softmax probabilities (heads × s per token) and stores K and V
                         repeated to all heads (2q instead of 2k)

Moments where a step peaks (the planner takes the largest):

- the start of backward: every layer's activations, the final norm's (3h), and the loss: the fp32
  log-softmax output, the gradient of the NLL and the log-softmax gradient, 12 bytes per token
  and vocabulary entry (the recipes drop the logits before backward, as torchtitan does);
- the top layer's backward: every layer's activations and the working set of one layer's backward
  (the MLP's gradients, 2f + h net of what it frees; with recompute, the recomputed layer too);
- the optimizer step: the whole model state.

FSDP (ZeRO-3) all-gathers a unit's parameters into a full-size buffer in the parameter dtype: the
root unit (embeddings, final norm, output head) stays gathered through the start of backward and the
next layer is prefetched; during a layer's backward two layers are gathered and that layer's
unsharded gradients exist (in the parameter dtype, and again in fp32 for the reduce-scatter when
the parameters are 16-bit). DDP keeps its gradient buckets, a second copy of the gradients, for
the life of the model. With one process (dp = 1) neither wrapper is applied, as in the recipes.
"""

from __future__ import annotations

from dataclasses import dataclass

FP32 = 4


def element_bytes(precision: str) -> int:
    """Bytes of an activation element: fp32 4, bf16/fp16 2."""
    return 4 if precision == "fp32" else 2


@dataclass(frozen=True, slots=True)
class LayerShape:
    """What the counts need of a layer (from `memory.ModelArch`)."""

    hidden: int
    q_width: int  # heads × head_dim
    kv_width: int  # kv_heads × head_dim
    heads: int
    ffn: int
    gated_mlp: bool
    rms_norm: bool


def _norm_elems(shape: LayerShape) -> int:
    """Per token per norm: input, normalized and output for RMSNorm (HF's is three ops); LayerNorm's
    fused kernel keeps its input and the output is the next matmul's input."""
    return 3 if shape.rms_norm else 2


def saved_per_token(shape: LayerShape, recompute: str, *, e: int, t: int = 1, sp: bool = True,
                    attention: str = "sdpa", seq: int = 0) -> float:
    """Bytes one layer keeps for backward per token of the micro-batch."""
    ts = t if sp else 1
    h, q, k, f = shape.hidden, shape.q_width, shape.kv_width, shape.ffn
    if recompute == "full":
        return e * h / ts
    if recompute == "selective":
        return e * (2 * h) / ts + e * (q + k + q + f) / t + FP32 * shape.heads / t
    kv = 2 * (q if attention == "eager" else k)
    mlp = (4 if shape.gated_mlp else 2) * f
    replicated = e * 2 * _norm_elems(shape) * h / ts + 2 * FP32 / ts  # the norms, their 1/rms
    split = e * (q + kv + q + mlp) / t + FP32 * shape.heads / t
    scores = e * shape.heads * seq / t if attention == "eager" else 0.0
    return replicated + split + scores


def working_set_per_token(shape: LayerShape, recompute: str, *, e: int, t: int = 1, sp: bool = True,
                          attention: str = "sdpa", seq: int = 0) -> float:
    """Transient bytes per token while one layer runs its backward (beyond what it saved)."""
    ts = t if sp else 1
    grads = e * ((2 if shape.gated_mlp else 1) * shape.ffn / t + shape.hidden / ts)
    if recompute == "none":
        return grads
    full = saved_per_token(shape, "none", e=e, t=t, sp=sp, attention=attention, seq=seq)
    return full - saved_per_token(shape, recompute, e=e, t=t, sp=sp, attention=attention, seq=seq) + grads


def final_norm_per_token(shape: LayerShape, *, e: int, t: int = 1, sp: bool = True) -> float:
    return e * _norm_elems(shape) * shape.hidden / (t if sp else 1)


def loss_per_token(vocab: int, *, t: int = 1) -> float:
    """fp32 log-softmax output + NLL gradient + log-softmax gradient at the start of backward."""
    return 3 * FP32 * vocab / t


__all__ = ["FP32", "LayerShape", "element_bytes", "final_norm_per_token", "loss_per_token", "saved_per_token",
           "working_set_per_token"]
