"""Placement constraints (`sched/constraints.py`, issue 17 item 3): `-C` features, the GPU model,
`-w` nodes to include, `-x` nodes to exclude and `--exclusive` are rules of the engine: a job
lands only where they allow, waits when those nodes are busy, and preempts only there."""

from __future__ import annotations

import dataclasses
import re

import pytest

from tests.sched.builders import nodes, pending, req, running, snapshot, teams
from trainyard.sched.cluster import ClusterState, Node
from trainyard.sched.constraints import ConstraintError, Where, feature_names, matches, parse_features, where_of
from trainyard.sched.engine import TrainyardPolicy
from trainyard.sched.placement import place
from trainyard.sched.types import Reason


def cluster() -> list[Node]:
    """n0, n1: a100 with ib; n2: a100 without; n3: h100 with ib and nvme."""
    ns = nodes(4, gpus=4)
    feats = [{"ib"}, {"ib"}, set(), {"ib", "nvme"}]
    models = ["a100", "a100", "a100", "h100"]
    return [dataclasses.replace(n, gpu_model=m, features=frozenset(f)) for n, m, f in zip(ns, models, feats)]


def names(state: ClusterState, p) -> set[str]:  # noqa: ANN001
    return {state.nodes[i].name for i in p.node_indices}


@pytest.mark.parametrize("text, has, ok", [
    ("ib", {"ib"}, True), ("ib&nvme", {"ib"}, False), ("ib&nvme", {"ib", "nvme"}, True),
    ("a|b", {"b"}, True), ("(a|b)&ib", {"b"}, False), ("(a|b)&ib", {"a", "ib"}, True),
    (" ib & nvme ", {"ib", "nvme"}, True), ("((ib))", {"ib"}, True),
])
def test_expressions_match_as_slurm_reads_them(text, has, ok):
    assert matches(parse_features(text), frozenset(has)) is ok


@pytest.mark.parametrize("text, says", [
    ("", "empty"), ("a&", "ends where a feature name"), ("&a", "where a feature name"),
    ("a&b|c", "mixes & and |"), ("(a|b", "unbalanced"), ("a|b)", "unexpected ')'"),
    ("[a|b]", "brackets"), ("a*2", "counts"), ("a,b", "',' is not an operator"), ("!a", "NOT"),
    ("a b", "join feature names"), ("a$b", "unexpected '$'"),
])
def test_malformed_expressions_say_why(text, says):
    with pytest.raises(ConstraintError, match=re.escape(says)):
        parse_features(text)


def test_feature_names_lists_each_once():
    assert feature_names(parse_features("(a|b)&a&c")) == ["a", "b", "c"]


def test_no_constraint_is_no_where():
    assert where_of() is None and where_of(include=[], exclude=None) is None
    assert where_of(constraint="ib") == Where("ib")


def test_a_feature_constraint_lands_only_on_nodes_with_it():
    state = ClusterState(cluster())
    p, _ = place(state, req(1, gpus=2, where=Where("nvme")))
    assert names(state, p) == {"n3"}
    p, _ = place(state, req(1, gpus=8, gpus_per_node=4, min_nodes=2, max_nodes=2, where=Where("ib")))
    assert names(state, p) <= {"n0", "n1", "n3"} and len(names(state, p)) == 2


def test_a_gpu_model_lands_on_that_model_and_spreads_over_its_smaller_nodes():
    state = ClusterState(cluster())
    p, _ = place(state, req(1, gpus=4, where=Where(gpu_model="h100")))
    assert names(state, p) == {"n3"}
    p, _ = place(state, req(1, gpus=12, where=Where(gpu_model="a100")))
    assert names(state, p) == {"n0", "n1", "n2"}
    assert place(state, req(1, gpus=5, where=Where(gpu_model="h100")))[0] is None


def test_exclude_avoids_the_node_and_include_takes_it():
    state = ClusterState(cluster())
    p, _ = place(state, req(1, gpus=2, where=Where(exclude=frozenset({"n0", "n1"}))))
    assert "n0" not in names(state, p) and "n1" not in names(state, p)
    p, _ = place(state, req(1, gpus=2, where=Where(include=frozenset({"n2"}))))
    assert names(state, p) == {"n2"}
    p, _ = place(state, req(1, gpus=12, gpus_per_node=4, min_nodes=3, max_nodes=3,
                            where=Where(include=frozenset({"n3"}))))
    assert "n3" in names(state, p) and len(names(state, p)) == 3
    p, _ = place(state, req(1, gpus=6, where=Where(include=frozenset({"n1", "n3"}))))
    assert names(state, p) == {"n1", "n3"} and p.gpus == 6


def test_a_job_whose_included_node_is_busy_waits():
    state = ClusterState(cluster())
    running(state, req(9, gpus=4), at=((2, (0, 1, 2, 3)),))
    p, why = place(state, req(1, gpus=1, where=Where(include=frozenset({"n2"}))))
    assert p is None and why == Reason.CAPACITY


def test_exclusive_takes_whole_untouched_nodes_and_every_gpu():
    state = ClusterState(cluster())
    running(state, req(9, gpus=1), at=((0, (0,)),))  # n0 is in use
    p, _ = place(state, req(1, gpus=2, where=Where(exclusive=True)))
    assert p.gpus == 4 and "n0" not in names(state, p)
    state.allocate(p)
    taken = names(state, p)
    q, _ = place(state, req(2, gpus=1))
    assert not names(state, q) & taken  # nothing else lands on the exclusive job's node


def test_the_engine_places_starts_and_charges_exclusive_jobs_their_whole_nodes():
    ns = cluster()
    snap = snapshot(ns, teams(a=16), [], [pending(req(1, gpus=1, where=Where(exclusive=True))),
                                         pending(req(2, gpus=1, where=Where("nvme")))])
    res = TrainyardPolicy().cycle(snap)
    starts = {s.job_id: s.placement for s in res.starts}
    assert starts[1].gpus == 4 and starts[2].node_indices == (3,)
    assert set(starts[1].node_indices).isdisjoint(starts[2].node_indices)
    # a quota of 3 GPUs cannot hold a 4-GPU node: the exclusive job waits on quota
    res = TrainyardPolicy().cycle(snapshot(ns, teams(a=(3, 0, None)), [], [pending(req(1, gpus=1, where=Where(exclusive=True)))]))
    assert not res.starts and res.pending[1].reason == Reason.QUOTA


def test_constrained_and_plain_jobs_of_one_shape_are_not_memoised_alike():
    """The cycle remembers shapes that did not fit; a constrained job that cannot fit must not make
    an unconstrained one of the same size wait, nor the other way round."""
    ns = cluster()
    state = ClusterState(ns)
    busy = running(state, req(9, team="b", cls="interactive", gpus=4), at=((3, (0, 1, 2, 3)),))
    snap = snapshot(ns, teams(a=16, b=4), [busy], [pending(req(1, gpus=4, where=Where("nvme"))),
                                                  pending(req(2, gpus=4, submit=1.0))])
    res = TrainyardPolicy().cycle(snap)
    assert [s.job_id for s in res.starts] == [2] and 3 not in res.starts[0].placement.node_indices
    assert res.pending[1].reason in (Reason.CAPACITY, Reason.TOPOLOGY)


def test_preemption_for_a_constrained_job_stops_only_jobs_on_nodes_it_may_use():
    ns = cluster()
    state = ClusterState(ns)
    low = [running(state, req(100 + i, team="b", cls="batch", gpus=4), at=((i, (0, 1, 2, 3)),)) for i in range(4)]
    snap = snapshot(ns, teams(a=16, b=0), low, [pending(req(1, cls="interactive", gpus=4, where=Where(gpu_model="h100")))],
                    now=10_000)
    res = TrainyardPolicy().cycle(snap)
    assert [v.job_id for v in res.preemptions] == [103]
    snap = snapshot(ns, teams(a=16, b=0), low, [pending(req(1, cls="interactive", gpus=4,
                                                            where=Where(include=frozenset({"n1"}))))], now=10_000)
    assert [v.job_id for v in TrainyardPolicy().cycle(snap).preemptions] == [101]
