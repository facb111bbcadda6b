"""FLOPs per token of a decoder model and the peak FLOP/s of the devices: what MFU divides.

Model FLOPs utilization (PaLM, appendix B; torchtitan's `get_num_flop_per_token`) counts the
FLOPs the model needs, not what the hardware did (recomputation is not counted): a matmul weight
costs 2 FLOPs per token forward and 4 backward, so 6 per parameter that takes part in a matmul
(every parameter but the input embedding, whose lookup is not a multiply; a tied output head
multiplies with the embedding's weights, so they count once), plus attention's two s x s
products, 12 x layers x heads x head_dim x seq per token (forward and backward, causal masking not
discounted, as the convention has it).

Peaks are the vendor's dense (no sparsity) tensor-core figures for the precision a step runs in:
bf16/fp16, or TF32 for fp32 with TF32 matmuls (the recipes' CUDA default). An unknown device, or
a CPU, has no peak unless the recipe gives `gpu_peak_tflops`: then no MFU is reported, only
tokens/s.
"""

from __future__ import annotations

from typing import Any

# dense TFLOPS per device: (name fragment as torch.cuda.get_device_name reports it, bf16, tf32)
PEAK_TFLOPS: tuple[tuple[str, float, float], ...] = (
    ("B200", 2250.0, 1100.0),
    ("H200", 989.0, 494.0),
    ("H100 PCIe", 756.0, 378.0),
    ("H100", 989.0, 494.0),  # SXM and NVL
    ("H800", 989.0, 494.0),
    ("A100", 312.0, 156.0),
    ("A800", 312.0, 156.0),
    ("L40S", 362.0, 183.0),
    ("L4", 121.0, 60.0),
    ("A10G", 70.0, 35.0),
    ("A10", 125.0, 62.5),
)


def flops_per_token(model: Any, seq_len: int) -> float:
    """Model FLOPs for one trained token of a transformers causal LM (forward and backward)."""
    cfg = model.config
    params = {id(p): p for p in model.parameters()}
    total = sum(p.numel() for p in params.values())
    embed = model.get_input_embeddings().weight
    tied = model.get_output_embeddings() is not None and model.get_output_embeddings().weight is embed
    matmul_params = total - (0 if tied else embed.numel())
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attention = 12 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * seq_len
    return 6.0 * matmul_params + attention


def device_peak_tflops(device_name: str, precision: str) -> float | None:
    """The dense peak of a GPU (by `torch.cuda.get_device_name`) for 'bf16' or 'tf32'; None if unknown."""
    for fragment, bf16, tf32 in PEAK_TFLOPS:
        if fragment.lower() in device_name.lower():
            return bf16 if precision == "bf16" else tf32
    return None


def peak_flops(device: Any, precision: str, world_size: int, override_tflops: float | None) -> float | None:
    """All ranks' peak FLOP/s together, or None when it is not known (a CPU without an override)."""
    if override_tflops is not None:
        return override_tflops * 1e12 * world_size
    if getattr(device, "type", "cpu") != "cuda":
        return None
    import torch

    tflops = device_peak_tflops(torch.cuda.get_device_name(device), precision)
    return None if tflops is None else tflops * 1e12 * world_size


__all__ = ["PEAK_TFLOPS", "device_peak_tflops", "flops_per_token", "peak_flops"]
