"""ResumableSampler: the order depends only on seed and epoch; the position is a global offset."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainyard.runtime import ResumableSampler


def global_order(world: int, steps: int, start: dict | None = None, n=50, batch=12, **kw) -> tuple[list[int], dict]:
    """Concatenate every rank's slice, step by step, for `steps` steps; return it and the end state."""
    samplers = [ResumableSampler(n, batch, seed=4, world_size=world, rank=r, **kw) for r in range(world)]
    if start:
        for s in samplers:
            s.load_state_dict(start)
    out: list[int] = []
    for _ in range(steps):
        for s in samplers:
            out += s.indices()
        for s in samplers:
            s.advance()
    return out, samplers[0].state_dict()


def test_order_is_independent_of_world_size():
    assert global_order(1, 10)[0] == global_order(2, 10)[0] == global_order(4, 10)[0] == global_order(3, 10)[0]


@pytest.mark.parametrize("worlds", [(2, 1), (1, 4), (4, 2), (3, 6)])
def test_resume_on_another_world_size_continues_without_skip_or_repeat(worlds):
    whole, _ = global_order(1, 9)
    first, state = global_order(worlds[0], 4)
    rest, _ = global_order(worlds[1], 5, start=state)
    assert first + rest == whole


def test_epochs_use_each_sample_once_and_drop_the_tail():
    s = ResumableSampler(50, 12, seed=1)
    assert s.batches_per_epoch == 4
    seen = []
    for _ in range(4):
        seen += s.indices()
        s.advance()
    assert len(set(seen)) == 48 and s.epoch == 1 and s.offset == 0
    assert s.permutation(0).tolist() != s.permutation(1).tolist()  # a fresh order every epoch
    assert s.samples_seen == 48


def test_keep_last_short_batch_when_asked():
    s = ResumableSampler(50, 12, seed=1, world_size=2, rank=1, drop_last=False)
    assert s.batches_per_epoch == 5
    s.advance(4)
    assert s.indices() == s.permutation(0)[48:].tolist()[1:]  # 2 left: one per rank
    s.advance()
    assert (s.epoch, s.offset) == (1, 0)


def test_iterating_as_batch_sampler_does_not_move_the_trained_position():
    data = TensorDataset(torch.arange(40))
    s = ResumableSampler(40, 8, seed=2)
    loader = DataLoader(data, batch_sampler=s)
    batches = [b[0].tolist() for b in loader]
    assert len(batches) == len(s) == 5 and (s.epoch, s.offset) == (0, 0)
    assert batches[0] == s.indices()
    s.advance(2)
    assert [b[0].tolist() for b in loader] == batches[2:]


def test_state_mismatch_is_refused():
    a = ResumableSampler(50, 10, seed=1)
    with pytest.raises(ValueError, match="global_batch_size=10, this run global_batch_size=20"):
        ResumableSampler(50, 20, seed=1).load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="seed"):
        ResumableSampler(50, 10, seed=2).load_state_dict(a.state_dict())


@pytest.mark.parametrize("kw,msg", [
    (dict(num_samples=0, global_batch_size=1), "num_samples"),
    (dict(num_samples=5, global_batch_size=6), "global_batch_size"),
    (dict(num_samples=50, global_batch_size=10, world_size=3), "not a multiple of world_size=3"),
    (dict(num_samples=50, global_batch_size=10, world_size=2, rank=2), "rank=2"),
])
def test_bad_sizes(kw, msg):
    with pytest.raises(ValueError, match=msg):
        ResumableSampler(**kw)
