"""`recipes/checkpointing.py`: the three activation-checkpointing modes on a real Llama step.

The same step under none, selective and full gives bit-identical loss and gradients (the
recomputed forward runs the same kernels), keeps fewer live bytes in that order (PyTorch's own
accounting), and leaves the parameter names, hence checkpoints and exports, as they were.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainyard.recipes import checkpointing
from trainyard.recipes.models import build_model
from trainyard.recipes.spec import ModelSpec


def step(mode: str):
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.manual_seed(0)
    model = build_model(ModelSpec(hidden_size=128, intermediate_size=344, num_layers=3, num_heads=4, num_kv_heads=2))
    names = [n for n, _ in model.named_parameters()]
    assert checkpointing.apply(model, mode) == (0 if mode == "none" else 3)
    assert [n for n, _ in model.named_parameters()] == names
    x = torch.randint(0, 259, (4, 257), generator=torch.Generator().manual_seed(1))
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        logits = model(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten(), reduction="sum")
        del logits
        loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    with torch.no_grad():  # evaluation runs the plain forward
        assert model(input_ids=x[:, :8]).logits.shape == (4, 8, 264)
    return loss.item(), grads, tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def test_the_modes_give_the_same_gradients_with_less_memory():
    (l0, g0, m0), (l1, g1, m1), (l2, g2, m2) = (step(m) for m in checkpointing.MODES)
    assert l0 == l1 == l2
    assert torch.equal(g0, g1) and torch.equal(g0, g2)
    assert m0 > m1 > m2, (m0, m1, m2)


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="'some'"):
        checkpointing.apply(torch.nn.Linear(2, 2), "some")
