"""A job's suspect nodes (where an earlier attempt hung or crashed) are used only when it fits
nowhere else: whole-GPU, shared-memory and gang placements all go elsewhere when they can."""

from __future__ import annotations

from trainyard.sched.cluster import ClusterState
from trainyard.sched.placement import place
from tests.sched.builders import nodes, req


def names(state: ClusterState, p) -> set[str]:  # noqa: ANN001
    return {state.nodes[i].name for i in p.node_indices}


def test_a_single_node_job_goes_to_another_node_than_its_suspect():
    state = ClusterState(nodes(3, gpus=4))
    plain, _ = place(state, req(1, gpus=2))
    assert names(state, plain) == {"n0"}  # best fit, lowest index
    moved, _ = place(state, req(1, gpus=2, avoid=frozenset({"n0"})))
    assert moved is not None and "n0" not in names(state, moved)


def test_a_shared_gpu_job_avoids_its_suspect_too():
    state = ClusterState(nodes(2, gpus=4))
    p, _ = place(state, req(1, gpus=1, gpu_mem_mib=10 * 1024, avoid=frozenset({"n0"})))
    assert names(state, p) == {"n1"}


def test_a_gang_avoids_the_suspect_when_enough_other_nodes_are_free():
    state = ClusterState(nodes(4, gpus=4))
    p, _ = place(state, req(1, gpus=8, gpus_per_node=4, min_nodes=2, max_nodes=2, avoid=frozenset({"n1"})))
    assert p is not None and "n1" not in names(state, p) and len(names(state, p)) == 2


def test_the_suspect_is_still_used_when_nothing_else_fits():
    state = ClusterState(nodes(2, gpus=4))
    p, why = place(state, req(1, gpus=8, gpus_per_node=4, min_nodes=2, max_nodes=2, avoid=frozenset({"n1"})))
    assert why is None and names(state, p) == {"n0", "n1"}
    state.allocate(place(state, req(2, gpus=4))[0])  # n0 is now full
    p, why = place(state, req(1, gpus=2, avoid=frozenset({"n1"})))
    assert why is None and names(state, p) == {"n1"}


def test_an_unknown_suspect_name_changes_nothing():
    state = ClusterState(nodes(2, gpus=4))
    assert place(state, req(1, gpus=2, avoid=frozenset({"gone"})))[0] == place(state, req(1, gpus=2))[0]
