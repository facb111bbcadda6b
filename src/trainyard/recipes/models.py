"""Model builders: transformers' Llama and Gemma classes from a small `ModelSpec`, random init
(or, with `model.from`, a Hugging Face checkpoint on disk: `recipes/hf_checkpoint.py`).

The real architectures (rotary embeddings, RMSNorm, SwiGLU/GeGLU, grouped- or multi-query
attention, Gemma's scaled and tied embeddings) at sizes a CPU trains in seconds. Built from a
config object, never `from_pretrained`: no file is read and nothing is downloaded. Initial
weights come from torch's generator, which `runtime.init(seed=…)` seeded identically on every
rank, so all ranks start from the same model (FSDP2 relies on it; DDP would broadcast anyway).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from trainyard.recipes.data import BOS, EOS, PAD
from trainyard.recipes.spec import ModelSpec

if TYPE_CHECKING:  # transformers loads only where a model is built
    from transformers import PreTrainedModel


def model_config(spec: ModelSpec):  # noqa: ANN201 - a transformers PretrainedConfig
    common: dict[str, Any] = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads or spec.num_heads,
        max_position_embeddings=spec.max_seq_len,
        attention_dropout=spec.attention_dropout,
        initializer_range=spec.init_std,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        use_cache=False,
    )
    if spec.head_dim is not None:
        common["head_dim"] = spec.head_dim
    if spec.arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(tie_word_embeddings=bool(spec.tie_embeddings), **common)
    from transformers import GemmaConfig

    if spec.head_dim is None:
        common["head_dim"] = spec.hidden_size // spec.num_heads
    return GemmaConfig(tie_word_embeddings=True if spec.tie_embeddings is None else spec.tie_embeddings, **common)


def build_model(spec: ModelSpec, *, load_weights: bool = True) -> PreTrainedModel:
    """A randomly initialized causal LM (float32, CPU; the caller moves it), or with `model.from`
    the Hugging Face checkpoint's model with its weights (`load_weights=False`: its architecture
    only, for a caller that loads a trainyard checkpoint over it)."""
    if spec.from_ is not None:
        from trainyard.recipes.hf_checkpoint import build_model as build_hf

        return build_hf(spec.from_, load_weights=load_weights)
    cfg = model_config(spec)
    # sdpa: the fused attention; on CPU and under deterministic algorithms it is deterministic.
    cfg._attn_implementation = "sdpa"
    if spec.arch == "llama":
        from transformers import LlamaForCausalLM

        return LlamaForCausalLM(cfg)
    from transformers import GemmaForCausalLM

    return GemmaForCausalLM(cfg)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks (the units FSDP2 shards one by one)."""
    layers = model.get_submodule("model.layers")
    assert isinstance(layers, torch.nn.ModuleList)
    return list(layers)


def count_parameters(model: torch.nn.Module) -> int:
    seen, n = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


__all__ = ["build_model", "count_parameters", "decoder_layers", "model_config"]
