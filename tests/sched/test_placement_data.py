"""Rule 6 of sched/placement.py: among placements the other rules find equal, nodes holding more of
the job's datasets (`JobRequest.data_on`) come first. A tie-break only: it never changes whether a
job fits, how many nodes, blocks or racks it takes, how tightly it packs, or whom quotas let start."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from trainyard.sched.cluster import ClusterState
from trainyard.sched.engine import TrainyardPolicy
from trainyard.sched.placement import place
from trainyard.sched.types import RunningJob, Snapshot
from tests.sched.builders import CLASSES, nodes, pending, req, teams


def names(state: ClusterState, p) -> set[str]:  # noqa: ANN001
    return {state.nodes[i].name for i in p.node_indices}


def test_a_single_node_job_goes_where_its_data_is_among_equal_nodes():
    state = ClusterState(nodes(3, gpus=4))
    assert names(state, place(state, req(1, gpus=2))[0]) == {"n0"}
    assert names(state, place(state, req(1, gpus=2, data_on=(("n2", 10),)))[0]) == {"n2"}
    assert names(state, place(state, req(1, gpus=2, data_on=(("n1", 10), ("n2", 20))))[0]) == {"n2"}


def test_a_tighter_fit_wins_over_the_data():
    state = ClusterState(nodes(2, gpus=4))
    state.allocate(place(state, req(9, gpus=2))[0])  # n0 has 2 free, n1 4
    p, _ = place(state, req(1, gpus=2, data_on=(("n1", 10**9),)))
    assert names(state, p) == {"n0"}  # best fit first: the data only breaks ties


def test_a_shared_gpu_job_prefers_the_data_among_equal_fits():
    state = ClusterState(nodes(2, gpus=4))
    p, _ = place(state, req(1, gpus=1, gpu_mem_mib=10 * 1024, data_on=(("n1", 5),)))
    assert names(state, p) == {"n1"}


def test_a_gang_takes_the_rack_with_its_data_among_racks_that_hold_it():
    state = ClusterState(nodes(4, gpus=4))  # b0: r0 = n0, n1; r1 = n2, n3
    gang = dict(gpus=8, gpus_per_node=4, min_nodes=2, max_nodes=2)
    assert names(state, place(state, req(1, **gang))[0]) == {"n0", "n1"}
    assert names(state, place(state, req(1, **gang, data_on=(("n2", 1), ("n3", 1))))[0]) == {"n2", "n3"}


def test_the_data_never_splits_a_gang_across_racks():
    state = ClusterState(nodes(4, gpus=4))
    gang = dict(gpus=8, gpus_per_node=4, min_nodes=2, max_nodes=2)
    p, _ = place(state, req(1, **gang, data_on=(("n1", 100), ("n2", 100))))  # one in each rack
    assert names(state, p) in ({"n0", "n1"}, {"n2", "n3"})  # one rack, whichever: never n1 + n2


def _shape(state: ClusterState, p) -> tuple:  # noqa: ANN001
    """What the other rules decide: node count, GPUs per node, blocks, racks, free left per node used."""
    used = [state.nodes[i] for i in p.node_indices]
    return (len(used), sorted(len(g) for _, g in p.nodes), len({n.block for n in used}), len({n.rack for n in used}),
            sorted(state.usable_on_node(i, None) for i in p.node_indices))  # as tight a fit


@pytest.mark.parametrize("seed", range(400))
def test_the_data_changes_no_fit_and_no_shape(seed):
    rnd = random.Random(seed)
    gpus = rnd.choice([2, 4, 8])
    state = ClusterState(nodes(rnd.randint(1, 8), gpus=gpus))
    for k in range(rnd.randint(0, 6)):  # some GPUs in use
        p, _ = place(state, req(100 + k, gpus=rnd.randint(1, gpus)))
        if p is not None:
            state.allocate(p)
    if rnd.random() < 0.5:
        r = req(1, gpus=rnd.randint(1, 2 * gpus))
    else:
        n = rnd.randint(1, 3)
        r = req(1, gpus=gpus * n, gpus_per_node=rnd.randint(1, gpus), min_nodes=n, max_nodes=n)
    data = tuple((f"n{i}", rnd.randint(1, 10**6)) for i in range(len(state.nodes)) if rnd.random() < 0.5)
    plain, why = place(state, r)
    tied, why_tied = place(state, replace(r, data_on=data))
    assert (plain is None) == (tied is None) and why == why_tied
    if plain is not None:
        a, b = _shape(state, plain), _shape(state, tied)
        # as many nodes, GPUs per node, blocks and as tight; never more racks (a GPU-count job's
        # spread counts no racks, so its data may land it in fewer)
        assert a[:3] == b[:3] and a[4] == b[4] and b[3] <= a[3], (a, b)
        if r.gpus_per_node is not None:
            assert a == b


def test_quotas_decide_whatever_the_data_says():
    state = ClusterState(nodes(2, gpus=4))
    tm = teams(a=(4, 0, None), b=(4, 0, None))  # no borrowing: a may hold 4 GPUs
    running = []
    first = req(1, team="a", gpus=4)
    pl, _ = place(state, first)
    state.allocate(pl)
    running.append(RunningJob(first, pl, 0.0, 0.0))
    over = req(2, team="a", gpus=4, submit=1.0, data_on=(("n1", 10**12),))  # its data on the free node
    other = req(3, team="b", gpus=4, submit=2.0)
    snap = Snapshot(10.0, state, tm, CLASSES, running, [pending(over), pending(other)])
    result = TrainyardPolicy().cycle(snap)
    assert [s.job_id for s in result.starts] == [3]
    plain = TrainyardPolicy().cycle(replace(snap, pending=[pending(replace(over, data_on=())), pending(other)]))
    assert [s.job_id for s in plain.starts] == [3] and plain.preemptions == result.preemptions
