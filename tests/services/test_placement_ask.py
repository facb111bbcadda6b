"""`-n/--ntasks` becomes the shape sbatch gives it (`services/placement_ask.apply_ntasks`), and
hostlists read as Slurm writes them; uneven or conflicting layouts are refused naming -n."""

from __future__ import annotations

import pytest

from trainyard.services.errors import ServiceError
from trainyard.services.placement_ask import apply_ntasks, hostlist


@pytest.mark.parametrize("given, want", [
    ({"ntasks": 8, "nodes": 2}, {"nodes": 2, "tasks_per_node": 4}),
    ({"ntasks": 4, "gpus": 4}, {"gpus": 4}),  # one task per GPU, wherever the GPUs are
    ({"ntasks": 2, "gpus": 4}, {"gpus": 4, "nodes": 1, "tasks_per_node": 2}),
    ({"ntasks": 2, "gpus_per_node": 2}, {"gpus_per_node": 2, "nodes": 1, "tasks_per_node": 2}),
    ({"ntasks": 3}, {"nodes": 1, "tasks_per_node": 3, "gpus_per_node": 3}),  # no GPUs asked: one per task
    ({"ntasks": 4, "nodes": 2, "tasks_per_node": 2}, {"nodes": 2, "tasks_per_node": 2}),
])
def test_ntasks_layouts(given, want):
    assert apply_ntasks(given) == {**want, "ntasks": given["ntasks"]}


@pytest.mark.parametrize("given, says", [
    ({"ntasks": 3, "nodes": 2}, "do not divide evenly"),
    ({"ntasks": 4, "nodes": "1-2"}, "range of nodes"),
    ({"ntasks": 4, "nodes": 2, "tasks_per_node": 1}, "conflicts with --ntasks-per-node=1"),
    ({"ntasks": 4, "tasks_per_node": 2}, "conflicts with --ntasks-per-node=2"),
])
def test_uneven_or_conflicting_layouts_are_refused(given, says):
    with pytest.raises(ServiceError, match=says) as e:
        apply_ntasks(given)
    assert str(e.value).startswith("-n/--ntasks")


def test_hostlists():
    assert hostlist("node-[0-1],gpu3", "--nodelist") == ["node-0", "node-1", "gpu3"]
    assert hostlist(["a", "a"], "--exclude") == ["a"]
    with pytest.raises(ServiceError, match="--exclude:"):
        hostlist("n[1-", "--exclude")
