"""FSDP2's meta-device start (`recipes/sharded_start.py`) on two real ranks (gloo, this CPU).

A Llama checkpoint written by `save_pretrained` (sharded safetensors) is started the way a large
model must be: built on the meta device, sharded, each rank reading only its rows. Per rank:
- the peak of live tensors during the start (PyTorch's own accounting, MemTracker, plus the one
  bf16 slice in transit that safetensors makes outside it) is at most 1.3x the rank's shard of
  the parameters — the whole-model start holds the full model, twice the shard, first;
- the sharded model computes the logits that `from_pretrained`'s whole model computes.
"""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from tests.recipes.hf_fixtures import train_tokenizer


def checkpoint(directory):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = train_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=160, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(directory, max_shard_size="100KB")  # bf16 on disk
    tok.save_pretrained(directory)
    return directory


def _rank(rank: int, port: int, ckpt: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed._tools.mem_tracker import MemTracker

    from trainyard.recipes.sharded_start import build_sharded
    from trainyard.recipes.spec import ModelSpec
    from trainyard.recipes.strategies import shard_fsdp2

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    spec = ModelSpec.model_validate({"from": ckpt})
    cpu = torch.device("cpu")
    tracker = MemTracker()
    with tracker:
        model = build_sharded(spec, cpu, load_checkpoint=True, shard=lambda m: shard_fsdp2(m, cpu))
    params = {id(p): p for p in model.parameters()}.values()
    in_transit = max(p.to_local().numel() * 2 for p in params)  # the largest bf16 slice safetensors hands over
    peak = tracker.get_tracker_snapshot("peak")[cpu]["Total"] + in_transit
    shard = sum(p.to_local().numel() * 4 for p in params)
    full = sum(p.numel() * 4 for p in params)
    ids = torch.arange(1, 33).reshape(2, 16)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    if rank == 0:
        torch.save(logits, out + ".logits")
        with open(out, "w") as f:
            json.dump({"peak": peak, "shard": shard, "full": full}, f)
    dist.barrier()
    dist.destroy_process_group()


def start(ckpt, tmp_path) -> tuple[dict, torch.Tensor]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "rank0.json")
    mp.spawn(_rank, args=(port, str(ckpt), out), nprocs=2, join=True)
    with open(out) as f:
        return json.load(f), torch.load(out + ".logits")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return checkpoint(tmp_path_factory.mktemp("hf") / "llama")


def test_meta_device_start_peaks_at_its_shard_and_computes_the_checkpoints_logits(ckpt, tmp_path):
    from transformers import LlamaForCausalLM

    got, logits = start(ckpt, tmp_path)
    print("sharded start:", got, round(got["peak"] / got["shard"], 3))
    assert got["peak"] <= 1.3 * got["shard"], got
    assert got["full"] >= 1.95 * got["shard"]  # what the whole-model start holds before it shards
    ref = LlamaForCausalLM.from_pretrained(ckpt, dtype=torch.float32, local_files_only=True).eval()
    with torch.no_grad():
        want = ref(input_ids=torch.arange(1, 33).reshape(2, 16)).logits
    assert torch.allclose(logits, want, rtol=0, atol=1e-5), (logits - want).abs().max()


@pytest.mark.slow
def test_init_from_a_run_starts_sharded_with_that_runs_weights(tmp_path):
    """`sft --set init_from=RUN` under FSDP2 on two ranks reads its shards of RUN's checkpoint
    through DCP: its first loss (before any update) is the one DDP computes from the whole model."""
    from tests.recipes.helpers import TINY_MODEL, losses, yard_run

    pre = tmp_path / "pre"
    rc, log = yard_run("llama-pretrain", pre, 1, [*TINY_MODEL, "data.seq_len=64", "data.max_bytes=400000",
                                                  "batch.global_batch_size=8", "steps=4", "checkpoint_every=4"])
    assert rc == 0, log[-3000:]
    first = {}
    for strategy in ("ddp", "fsdp2"):
        out = tmp_path / strategy
        rc, log = yard_run("sft", out, 2, [f"init_from={pre}", f"strategy={strategy}", "data.max_operand=9",
                                           "batch.global_batch_size=8", "steps=2", "checkpoint_every=null"])
        assert rc == 0, log[-3000:]
        assert ("FSDP2 start on the meta device" in log) == (strategy == "fsdp2"), log[-3000:]
        first[strategy] = losses(out)[1]
    assert first["fsdp2"] == pytest.approx(first["ddp"], rel=1e-6), first
