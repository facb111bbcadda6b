"""The recipes' per-step all-reduce of the loss (`Trainer.global_sum`) is timed as the step's comm:
a rank ahead of the others waits in it, and the straggler detector (issue 39) must not count
that wait as the rank's own work."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from trainyard.recipes.train import Trainer


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class Phases:
    def __init__(self) -> None:
        self.open: list[str] = []
        self.reduced_inside: list[str] = []

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.open.append(name)
        try:
            yield
        finally:
            self.open.pop()


def test_the_loss_all_reduce_runs_inside_the_comm_phase(one_rank_group, monkeypatch):
    run = Phases()
    real = dist.all_reduce

    def all_reduce(t, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202 — dist's own signature
        run.reduced_inside.extend(run.open or ["(none)"])
        return real(t, *a, **kw)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    trainer = SimpleNamespace(ctx=SimpleNamespace(distributed=True), device=torch.device("cpu"), run=run)
    total = Trainer.global_sum(trainer, torch.tensor(2.0), 3.0)  # type: ignore[arg-type]
    assert total.tolist() == [2.0, 3.0] and run.reduced_inside == ["comm"]
    # before the Run exists (a set-up step), no phase to time it in
    run.reduced_inside.clear()
    Trainer.global_sum(SimpleNamespace(ctx=trainer.ctx, device=trainer.device), 1.0)  # type: ignore[arg-type]
    assert run.reduced_inside == ["(none)"]
