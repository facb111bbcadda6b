"""Time-sharing of borrowed GPUs by attained service (`EngineParams.share_below_gpu_s`).

One node of 8 GPUs; teams a and b with a nominal quota of 4 each, c with 0 (it only borrows).
Long jobs (estimated 10 days, checkpointing every 30 minutes) have run for ten hours; a short
new job (estimated one hour) arrives on the full node.
"""

from dataclasses import replace

from trainyard.sched.cluster import ClusterState
from trainyard.sched.engine import EngineParams, TrainyardPolicy
from trainyard.sched.types import Reason

from tests.sched.builders import nodes, pending, req, running, snapshot, teams

SHARING = TrainyardPolicy(EngineParams(share_below_gpu_s=3200.0, share_ratio=4.0))
NOW = 36_000.0 + 100.0  # 100 s past the 20th checkpoint of a job started at 0
LONG = 10 * 86400.0


def long_job(state, jid, team, start, est=LONG, **kw):
    """A 1-GPU job started at `start`; its checkpoints fall every 1800 s after it."""
    return running(state, req(jid, team, est_runtime_s=est, checkpoint_interval_s=1800.0), start=start, **kw)


def short(jid, team, **kw):
    return pending(req(jid, team, submit=NOW - 10, est_runtime_s=3600.0), **kw)


def test_a_short_job_takes_the_gpu_of_a_long_borrowing_job_that_just_checkpointed():
    ns = nodes(1)
    state = ClusterState(ns)
    # a uses 2 of its 4 GPUs; b uses 6, borrowing a's 2 idle ones.
    run = [long_job(state, 100 + i, "a", start=900.0) for i in range(2)]  # 1,000 s since checkpoint
    run += [long_job(state, 200 + i, "b", start=10.0 * i) for i in range(6)]  # 100, 90, ... 50 s
    tm = teams(a=4, b=4)
    res = SHARING.cycle(snapshot(ns, tm, run, [short(209, "b")], now=NOW))
    # b's short job would borrow a third GPU, which nobody can lend: it takes the GPU of b's own
    # long job that loses the least work (b5, 50 s since its checkpoint). a's long jobs are
    # inside a's quota, and 1,000 s past their checkpoint besides.
    assert [(p.job_id, p.reason, p.for_job) for p in res.preemptions] == [(205, "share", 209)]
    assert res.starts == [] and res.pending[209].reason == Reason.PREEMPTING


def test_sharing_is_on_by_default_and_none_turns_it_off():
    ns = nodes(1)
    state = ClusterState(ns)
    run = [long_job(state, 200 + i, "b", start=10.0 * i) for i in range(8)]
    snap = snapshot(ns, teams(a=4, b=4), run, [short(209, "b")], now=NOW)
    assert [p.reason for p in TrainyardPolicy().cycle(snap).preemptions] == ["share"]
    assert TrainyardPolicy(EngineParams(share_below_gpu_s=None)).cycle(snap).preemptions == []


def test_a_team_at_its_nominal_quota_is_never_shared():
    ns = nodes(1)
    state = ClusterState(ns)
    run = [long_job(state, 100 + i, "a", start=10.0 * i) for i in range(4)]
    run += [long_job(state, 200 + i, "b", start=10.0 * i) for i in range(4)]
    tm = teams(a=4, b=4, c=0)
    # c only borrows, and nobody borrows now: every GPU is inside a or b's nominal quota.
    res = SHARING.cycle(snapshot(ns, tm, run, [short(301, "c")], now=NOW))
    assert res.preemptions == []
    # a's own short job may take the GPU of one of a's long jobs: a stays at its quota.
    res = SHARING.cycle(snapshot(ns, tm, run, [short(109, "a")], now=NOW))
    assert [(p.job_id, p.reason) for p in res.preemptions] == [(103, "share")]


def test_a_victim_far_from_its_last_checkpoint_is_not_shared_unless_it_saves_on_the_notice():
    ns = nodes(1)
    state = ClusterState(ns)
    run = [long_job(state, 200 + i, "b", start=600.0 + 10.0 * i) for i in range(8)]  # 1,000-1,070 s lost
    snap = snapshot(ns, teams(a=4, b=4), run, [short(209, "b")], now=NOW)
    # A class whose jobs ignore the notice would lose those 1,000 s: not shared.
    ignoring = {**snap.classes, "training": replace(snap.classes["training"], checkpoint_on_notice=False)}
    assert SHARING.cycle(replace(snap, classes=ignoring)).preemptions == []
    # The default class checkpoints on the notice: it loses its save and restart, whatever the
    # time since its last checkpoint, and the one that risks least (the newest checkpoint) goes.
    assert [p.job_id for p in SHARING.cycle(snap).preemptions] == [207]


def test_a_job_that_has_held_many_gpu_seconds_does_not_share():
    ns = nodes(1)
    state = ClusterState(ns)
    run = [long_job(state, 200 + i, "b", start=10.0 * i) for i in range(8)]
    # A requeued long job (it has held 20,000 GPU-seconds) waits its turn.
    res = SHARING.cycle(snapshot(ns, teams(a=4, b=4), run, [short(209, "b", attained_gpu_s=20_000.0)], now=NOW))
    assert res.preemptions == []


def test_a_victim_must_have_several_times_the_work_left():
    ns = nodes(1)
    state = ClusterState(ns)
    # Estimated 12 hours, 10 done: 2 hours left, under 4 x the short job's hour.
    run = [long_job(state, 200 + i, "b", start=10.0 * i, est=12 * 3600.0) for i in range(8)]
    res = SHARING.cycle(snapshot(ns, teams(a=4, b=4), run, [short(209, "b")], now=NOW))
    assert res.preemptions == []


def test_an_attempt_that_has_not_reached_a_checkpoint_yet_is_not_shared():
    ns = nodes(1)
    state = ClusterState(ns)
    # Restarted 1,000 s ago after 10 hours on an earlier attempt: nothing of this attempt is saved.
    run = [long_job(state, 200 + i, "b", start=NOW - 1000.0, attained_gpu_s=36_000.0, progress_s=36_000.0)
           for i in range(8)]
    res = SHARING.cycle(snapshot(ns, teams(a=4, b=4), run, [short(209, "b")], now=NOW))
    assert res.preemptions == []
