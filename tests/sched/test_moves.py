"""Moves (step 5e, `sched/reclaim/moves.py`): a gang blocked only by fragmentation gets a node.

Two 8-GPU nodes, each half full of team b's single-GPU training jobs: 8 GPUs are free in the
pool, none of them a whole node, so team a's 8-GPU job fits its quota but no node. Classes are
the builders' (training: min run 10 min, grace 2 min, checkpoints on the notice).
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard.sched.cluster import ClusterState, Placement
from trainyard.sched.engine import EngineParams, TrainyardPolicy
from trainyard.sched.placement import place
from trainyard.sched.types import Reason, RunningJob

from tests.hypothesis_setup import examples
from tests.sched.builders import CLASSES, nodes, pending, req, running, snapshot, teams

ENGINE = TrainyardPolicy()
NOW = 10 * 3600.0
GANG = 1


def _fragmented(started_ago: float = 3600.0, waited: float = 600.0, per_node: int = 4, cls: str = "training"):
    ns, tm = nodes(2), teams(a=8, b=8)
    state = ClusterState(ns)
    run = [running(state, req(200 + 10 * n + g, "b", cls, gpus=1, est_runtime_s=86400), start=NOW - started_ago,
                   at=((n, (g,)),))
           for n in range(2) for g in range(per_node)]
    gang = pending(req(GANG, "a", gpus=8, gpus_per_node=8, min_nodes=1, max_nodes=1, submit=NOW - waited,
                       est_runtime_s=3600))
    return ns, tm, run, gang


def test_a_gang_blocked_by_fragmentation_moves_the_smaller_jobs_of_one_node_aside():
    ns, tm, run, gang = _fragmented()
    res = ENGINE.cycle(snapshot(ns, tm, run, [gang], now=NOW))
    moved = sorted(p.job_id for p in res.preemptions)
    assert {p.reason for p in res.preemptions} == {"move"} and {p.for_job for p in res.preemptions} == {GANG}
    assert moved in ([200, 201, 202, 203], [210, 211, 212, 213])  # one node's jobs, all of them
    assert res.pending[GANG].reason == Reason.PREEMPTING
    # Once they have left, the gang starts on that node and each mover fits on the other one.
    node = 0 if moved[0] == 200 else 1
    stayed = [r for r in run if r.req.id not in moved]
    state = ClusterState(ns)
    for r in stayed:
        state.allocate(r.placement)
    movers = [pending(replace(r.req, submit_time=r.req.submit_time), queued_since=NOW + 150) for r in run if r.req.id in moved]
    res = ENGINE.cycle(snapshot(ns, tm, stayed, [gang, *movers], now=NOW + 150))
    starts = {s.job_id: s.placement for s in res.starts}
    assert starts[GANG].node_indices == (node,)
    assert all(starts[m.req.id].node_indices == (1 - node,) for m in movers)
    assert res.preemptions == []


def test_without_the_rule_the_gang_waits_for_a_node_to_drain():
    ns, tm, run, gang = _fragmented()
    res = TrainyardPolicy(EngineParams(move_for_gangs=False)).cycle(snapshot(ns, tm, run, [gang], now=NOW))
    assert res.preemptions == [] and res.pending[GANG].reason == Reason.TOPOLOGY


def test_nothing_moves_before_the_gang_has_waited_or_while_the_jobs_are_within_their_min_run_time():
    ns, tm, run, gang = _fragmented(waited=30.0)
    res = ENGINE.cycle(snapshot(ns, tm, run, [gang], now=NOW))
    assert res.preemptions == [] and res.pending[GANG].reason == Reason.TOPOLOGY
    ns, tm, run, gang = _fragmented(started_ago=300.0)  # min run time is 10 min
    res = ENGINE.cycle(snapshot(ns, tm, run, [gang], now=NOW))
    assert res.preemptions == [] and res.pending[GANG].reason == Reason.TOPOLOGY


def test_jobs_that_do_not_save_on_the_notice_are_never_moved():
    ns, tm, run, gang = _fragmented()
    classes = {**CLASSES, "training": replace(CLASSES["training"], checkpoint_on_notice=False)}
    snap = replace(snapshot(ns, tm, run, [gang], now=NOW), classes=classes)
    res = ENGINE.cycle(snap)
    assert res.preemptions == []


def test_a_move_needs_room_for_every_mover_elsewhere():
    """Node 0 holds a 4-GPU and a 1-GPU training job, node 1 five interactive ones (never victims):
    6 GPUs are free, 3 on each node. A 6-GPU gang could have node 0 by moving the 4-GPU job, but
    that job would then find no node with 4 free GPUs: no move. A 7-GPU gang finds the pool short
    of GPUs (not fragmented): no move either."""
    ns, tm = nodes(2), teams(a=8, b=16)
    state = ClusterState(ns)
    run = [running(state, req(200, "b", gpus=4, est_runtime_s=86400), start=NOW - 3600, at=((0, (0, 1, 2, 3)),)),
           running(state, req(201, "b", gpus=1, est_runtime_s=86400), start=NOW - 3600, at=((0, (4,)),))]
    run += [running(state, req(210 + g, "b", "interactive", gpus=1), start=NOW - 3600, at=((1, (g,)),)) for g in range(5)]
    for size in (6, 7):
        gang = pending(req(GANG, "a", gpus=size, gpus_per_node=size, min_nodes=1, max_nodes=1, submit=NOW - 600))
        res = ENGINE.cycle(snapshot(ns, tm, run, [gang], now=NOW))
        assert res.preemptions == [], size
    # With room for the 4-GPU job on node 1 (one interactive job fewer there), node 0 is freed.
    fewer = [r for r in run if r.req.id != 214]
    gang = pending(req(GANG, "a", gpus=6, gpus_per_node=6, min_nodes=1, max_nodes=1, submit=NOW - 600))
    res = ENGINE.cycle(snapshot(ns, tm, fewer, [gang], now=NOW))
    assert [(p.job_id, p.reason) for p in res.preemptions] == [(200, "move")]


def test_single_gpu_jobs_move_nothing():
    ns, _, run, _ = _fragmented(per_node=7)  # one GPU free on each node; b does not borrow
    one = pending(req(GANG, "a", gpus=1, submit=NOW - 600))
    res = ENGINE.cycle(snapshot(ns, teams(a=8, b=16), run, [one], now=NOW))
    assert res.preemptions == [] and [s.job_id for s in res.starts] == [GANG]
    two = pending(req(GANG, "a", gpus=2, gpus_per_node=2, min_nodes=1, max_nodes=1, submit=NOW - 600))
    res = ENGINE.cycle(snapshot(ns, teams(a=8, b=16), run, [two], now=NOW))
    assert [p.reason for p in res.preemptions] == ["move"]  # a 2-GPU gang moves one job


@st.composite
def fragmented_pools(draw):
    """Nodes of 8 GPUs holding random small jobs (1, 2 or 4 GPUs; every class; teams a and b;
    started up to two hours ago), and one pending gang of a (2-16 GPUs) that has waited."""
    n_nodes = draw(st.integers(2, 5))
    ns = nodes(n_nodes)
    tm = teams(a=draw(st.integers(8, 8 * n_nodes)), b=draw(st.integers(0, 8 * n_nodes)))
    state = ClusterState(ns)
    run = []
    k = 0
    for i in range(n_nodes):  # every node holds a few: that is how a pool fragments
        for _ in range(draw(st.integers(1, 4))):
            k += 1
            r = req(200 + k, draw(st.sampled_from(["a", "b"])), draw(st.sampled_from(["training", "training", "batch", "interactive"])),
                    gpus=draw(st.sampled_from([1, 1, 2, 4])), est_runtime_s=86400)
            free = [g for g, f in enumerate(state.free_mib[i]) if f == state.cap_mib[i]]
            if len(free) < r.gpus:
                continue
            got = Placement(((i, tuple(free[: r.gpus])),), (state.cap_mib[i],))
            state.allocate(got)
            run.append(RunningJob(r, got, NOW - draw(st.floats(0, 7200)), NOW - 600))
    size = draw(st.sampled_from([4, 6, 8, 8, 16]))
    per_node = min(size, 8)
    gang = pending(req(GANG, "a", gpus=size, gpus_per_node=per_node, min_nodes=size // per_node,
                       max_nodes=size // per_node, submit=NOW - draw(st.floats(0, 3600))))
    return snapshot(ns, tm, run, [gang], now=NOW)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fragmented_pools())
def test_every_move_follows_the_rules_and_every_mover_fits_back(snap):
    res = ENGINE.cycle(snap)
    moves = [p for p in res.preemptions if p.reason == "move"]
    if not moves:
        return
    gang = snap.pending[0].req
    running = {r.req.id: r for r in snap.running}
    movers = [running[p.job_id] for p in moves]
    assert snap.now - snap.pending[0].queued_since >= EngineParams().move_after_s
    for v in movers:
        cls = snap.classes[v.req.job_class]
        assert cls.preemptible and cls.checkpoint_on_notice and snap.now - v.start_time >= cls.min_run_s
        assert len(v.placement.nodes) == 1 and v.gpus < gang.min_gpus  # never a gang, never its size
    # Once every victim has left, the gang has a place and each mover fits beside it, at once.
    view = snap.cluster.copy()
    for p in res.preemptions:
        view.release(running[p.job_id].placement)
    pl, _ = place(view, gang, gang.min_nodes)
    assert pl is not None
    view.allocate(pl)
    for v in sorted(movers, key=lambda v: -v.gpus):
        got, _ = place(view, v.req, 1)
        assert got is not None, f"mover {v.req.id} has nowhere to go"
        view.allocate(got)
    assert res.pending[GANG].reason == Reason.PREEMPTING
