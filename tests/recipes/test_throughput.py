"""`recipes/throughput.py` (FLOPs per token, device peaks) and the runtime's `mfu` metric."""

from __future__ import annotations

import json

import pytest
import torch

from trainyard.recipes import throughput as T
from trainyard.runtime.metrics import MetricsLogger


def meta_model(cls_name: str, **cfg):
    import transformers

    config = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))(**cfg)
    with torch.device("meta"):
        return getattr(transformers, cls_name)(config)


def test_llama_3_8b_flops_per_token_follow_the_convention():
    m = meta_model("LlamaForCausalLM", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                   num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8)
    n = sum(p.numel() for p in m.parameters())
    assert n == 8_030_261_248
    got = T.flops_per_token(m, 8192)
    assert got == 6 * (n - 128256 * 4096) + 12 * 32 * 32 * 128 * 8192  # the embedding lookup is no matmul
    assert got == pytest.approx(5.79e10, rel=0.01)


def test_a_tied_head_counts_the_embedding_once():
    m = meta_model("GemmaForCausalLM", vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=1, head_dim=16)
    n = sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())
    assert T.flops_per_token(m, 100) == 6 * n + 12 * 2 * 4 * 16 * 100


def test_peaks_by_device_and_override():
    assert T.device_peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.0
    assert T.device_peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0
    assert T.device_peak_tflops("NVIDIA H200", "tf32") == 494.0
    assert T.device_peak_tflops("Some Accelerator", "bf16") is None
    assert T.peak_flops(torch.device("cpu"), "bf16", 4, None) is None
    assert T.peak_flops(torch.device("cpu"), "bf16", 4, 2.5) == 1e13


def test_metrics_lines_carry_mfu_when_the_peak_is_known(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=False)
    log.start_clock()
    log.log_step(1, tokens=1000, loss=1.0)
    log.set_flops(6e6, 1e9)
    log.log_step(2, tokens=1000, loss=0.5)
    first, second = (json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines())
    assert "mfu" not in first
    assert second["mfu"] == pytest.approx(second["tokens_per_s"] * 6e6 / 1e9, rel=1e-3)
