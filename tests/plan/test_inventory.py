"""`plan/inventory.py` and the planner's moments: the counts that the measured table rests on."""

from __future__ import annotations

import pytest

from trainyard.plan import inventory as I
from trainyard.plan.memory import TrainSetup, get_model, memory_per_gpu

LLAMA = I.LayerShape(hidden=4096, q_width=4096, kv_width=1024, heads=32, ffn=14336, gated_mlp=True, rms_norm=True)


def test_a_layer_without_recompute_keeps_norms_qkv_attention_output_and_four_mlp_tensors():
    e = 2
    got = I.saved_per_token(LLAMA, "none", e=e)
    assert got == e * (6 * 4096 + 4096 + 2 * 1024 + 4096 + 4 * 14336) + 4 * 32 + 2 * 4
    # eager attention adds the probabilities (heads x seq) and repeats K and V to every head
    eager = I.saved_per_token(LLAMA, "none", e=e, attention="eager", seq=2048)
    assert eager - got == e * 32 * 2048 + e * 2 * (4096 - 1024)


def test_recompute_keeps_less_and_pays_in_the_working_set():
    e = 2
    none, sel, full = (I.saved_per_token(LLAMA, r, e=e) for r in ("none", "selective", "full"))
    assert full == e * 4096 < sel < none
    assert sel == e * (2 * 4096 + 4096 + 1024 + 4096 + 14336) + 4 * 32  # torchtitan's every-other-matmul policy
    ws_none = I.working_set_per_token(LLAMA, "none", e=e)
    assert ws_none == e * (2 * 14336 + 4096)
    assert I.working_set_per_token(LLAMA, "full", e=e) == none - full + ws_none


def test_tensor_parallelism_divides_the_split_terms_and_sequence_parallelism_the_rest():
    one, tp = I.saved_per_token(LLAMA, "none", e=2), I.saved_per_token(LLAMA, "none", e=2, t=4)
    assert tp == pytest.approx(one / 4)
    assert I.saved_per_token(LLAMA, "none", e=2, t=4, sp=False) > tp


def test_one_process_has_no_wrapper_buffers_fsdp_and_ddp_do():
    m = get_model("llama-2-7b")
    one = memory_per_gpu(m, TrainSetup("fsdp", seq=4096), dp=1)
    two = memory_per_gpu(m, TrainSetup("fsdp", seq=4096), dp=2)
    assert one.buffers == 0 and two.buffers == 2 * (m.embedding_params + m.norm_params + m.output_params
                                                     + m.layer_params)
    ddp = memory_per_gpu(m, TrainSetup("ddp", seq=4096), dp=2)
    assert ddp.buffers == 2 * m.params  # bf16 gradients, a second time in the buckets


def test_gradients_are_live_during_backward_only_when_accumulating():
    m = get_model("llama-2-7b")
    single = memory_per_gpu(m, TrainSetup("zero3", seq=4096), dp=8)
    accum = memory_per_gpu(m, TrainSetup("zero3", seq=4096, grad_accumulation=4), dp=8)
    start = dict(single.moments)["start of backward"]
    assert dict(accum.moments)["start of backward"] == pytest.approx(start + single.gradients)


def test_bad_settings_name_the_field():
    from trainyard.plan.memory import PlanError

    m = get_model("llama-2-7b")
    for field, setup in (("attention", TrainSetup(attention="flash3")),
                         ("activation_model", TrainSetup(activation_model="guess")),
                         ("grad_accumulation", TrainSetup(grad_accumulation=0))):
        with pytest.raises(PlanError) as e:
            setup.check(m)
        assert e.value.field == field
