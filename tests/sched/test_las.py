"""Least-attained-service within a team's own quota (`Team.las`, engine step 5c; issue 20 part 3).

One node of 8 GPUs. Team a (nominal 8 unless said) runs long jobs that have held more than 16
GPU-hours (the default threshold); a young job of a arrives on the full node.
"""

from dataclasses import replace

import pytest
from hypothesis import given

from trainyard.sched.cluster import ClusterState
from trainyard.sched.engine import EngineParams, TrainyardPolicy
from trainyard.sched.types import ALL_CLASSES, Quota, Reason, Team

from tests.sched.builders import nodes, pending, req, running, snapshot
from tests.sched.test_properties import SETTINGS, snapshots

ENGINE = TrainyardPolicy(EngineParams(share_below_gpu_s=None))  # the rule alone, time-sharing (5b) off
NOW = 100_000.0
HELD = 20 * 3600.0  # GPU-seconds the long jobs held before their current attempt


def team(name="a", nominal=8, las=frozenset({ALL_CLASSES}), cohort="lab"):
    return Team(name, cohort, {"default": Quota(nominal)}, las)


def long_jobs(state, team_name="a", n=2, gpus=4, cls="training", est=10 * 86400.0, first_id=100, start=NOW - 7200):
    return [running(state, req(first_id + k, team_name, cls, gpus=gpus, est_runtime_s=est), start=start,
                    attained_gpu_s=HELD) for k in range(n)]


def young(jid=110, team_name="a", cls="training", gpus=4, est=3600.0, **kw):
    return pending(req(jid, team_name, cls, gpus=gpus, submit=NOW - 60, est_runtime_s=est), **kw)


def cycle(run, pend, teams, now=NOW, engine=ENGINE):
    return engine.cycle(snapshot(nodes(1), teams, run, pend, now=now))


def test_a_young_job_takes_the_gpus_of_its_own_teams_long_job():
    state = ClusterState(nodes(1))
    res = cycle(long_jobs(state), [young()], {"a": team()})
    assert [(p.reason, p.for_job) for p in res.preemptions] == [("las", 110)]
    assert res.pending[110].reason == Reason.PREEMPTING


def test_off_unless_the_team_asks_for_it():
    state = ClusterState(nodes(1))
    res = cycle(long_jobs(state), [young()], {"a": team(las=frozenset())})
    assert res.preemptions == []


def test_by_class_only_the_classes_named():
    state = ClusterState(nodes(1))
    run = long_jobs(state, cls="batch")
    assert cycle(run, [young(cls="batch")], {"a": team(las=frozenset({"training"}))}).preemptions == []
    assert [p.reason for p in cycle(run, [young(cls="batch")], {"a": team(las=frozenset({"batch"}))}).preemptions] == ["las"]


def test_never_another_teams_job():
    # b's long jobs fill the node inside b's quota; a (nominal 0 here: all of it borrowed by no
    # one) asks for las, but las only takes a's own jobs.
    state = ClusterState(nodes(1))
    run = long_jobs(state, team_name="b", first_id=200)
    res = cycle(run, [young()], {"a": team(nominal=0), "b": team("b", las=frozenset())})
    assert res.preemptions == []


def test_a_victim_closer_to_its_end_than_the_young_job_is_not_stopped():
    state = ClusterState(nodes(1))
    # 7,200 s into attempts estimated at 2 h 30 m: 30 minutes left, less than the young job's hour.
    run = long_jobs(state, est=9000.0)
    res = cycle(run, [young()], {"a": team()})
    assert res.preemptions == []


def test_a_job_that_has_held_much_waits_its_turn():
    state = ClusterState(nodes(1))
    res = cycle(long_jobs(state), [young(attained_gpu_s=17 * 3600.0)], {"a": team()})
    assert res.preemptions == []


def test_a_victim_that_ignores_notices_must_have_saved_recently():
    state = ClusterState(nodes(1))
    run = long_jobs(state)
    run = [replace(r, req=replace(r.req, checkpoint_interval_s=1800.0)) for r in run]
    snap = snapshot(nodes(1), {"a": team()}, run, [young()], now=NOW)
    ignoring = {**snap.classes, "training": replace(snap.classes["training"], checkpoint_on_notice=False)}
    # Checkpoints every 30 minutes since NOW - 7200: the last one at NOW (0 s lost): shareable.
    assert [p.reason for p in ENGINE.cycle(replace(snap, classes=ignoring)).preemptions] == ["las"]
    later = replace(snap, classes=ignoring, now=NOW + 1000.0)  # 1,000 s since it: not
    assert ENGINE.cycle(later).preemptions == []


def test_no_ping_pong_the_victim_cannot_take_the_gpus_back():
    state = ClusterState(nodes(1))
    run = long_jobs(state)
    res = cycle(run, [young()], {"a": team()})
    (victim,) = [r for r in run if r.req.id == res.preemptions[0].job_id]
    # The young job runs on the victim's GPUs; the victim waits with its attained service.
    state2 = ClusterState(nodes(1))
    other = [r for r in run if r is not victim]
    for r in other:
        state2.allocate(r.placement)
    now = NOW + 700.0  # past the young job's min run time
    started = running(state2, young().req, start=NOW + 30)
    back = pending(victim.req, attempt=1, queued_since=NOW + 30,
                   attained_gpu_s=victim.attained_gpu_s + (NOW + 30 - victim.start_time) * victim.gpus)
    res2 = ENGINE.cycle(snapshot(nodes(1), {"a": team()}, other + [started], [back], now=now))
    assert res2.preemptions == []


def test_the_threshold_is_a_parameter():
    state = ClusterState(nodes(1))
    run = long_jobs(state)
    high = TrainyardPolicy(EngineParams(las_above_gpu_s=100 * 3600.0, share_below_gpu_s=None))
    assert cycle(run, [young()], {"a": team()}, engine=high).preemptions == []


LOW = TrainyardPolicy(EngineParams(las_below_gpu_s=3600.0, las_above_gpu_s=3600.0, share_below_gpu_s=None))  # random jobs reach it


@pytest.mark.parametrize("engine", [ENGINE, LOW], ids=["default", "low-threshold"])
@SETTINGS
@given(snapshots())
def test_las_stays_inside_the_team_and_its_queues(engine, snap):
    res = engine.cycle(snap)
    running = {r.req.id: r for r in snap.running}
    pend = {pj.req.id: pj for pj in snap.pending}
    p = engine.params
    for pre in res.preemptions:
        if pre.reason != "las":
            continue
        v, pj = running[pre.job_id], pend[pre.for_job]
        t = snap.teams[pj.req.team]
        assert v.req.team == pj.req.team, "never another team's job"
        assert t.las_for(v.req.job_class) and t.las_for(pj.req.job_class)
        assert snap.classes[v.req.job_class].priority == snap.classes[pj.req.job_class].priority
        held = v.attained_gpu_s + (snap.now - v.start_time) * v.gpus
        assert pj.attained_gpu_s < p.las_below_gpu_s <= p.las_above_gpu_s <= held  # so it cannot stop it back
    # No team other than the preemptors' loses a job to las.
    teams_for = {pend[pre.for_job].req.team for pre in res.preemptions if pre.reason == "las"}
    assert all(running[pre.job_id].req.team in teams_for for pre in res.preemptions if pre.reason == "las")
