"""Overdue jobs (issue 20 part 5, `sched/reclaim/overdue.py`): a large job its own team's smaller
jobs would starve gets a bounded wait.

Classes are the builders' (training: priority 200, max wait 24 h, so overdue after a quarter of
it, 6 h pending; min run 10 min, grace 2 min). Two 8-GPU nodes; team a's quota is 8 and its
1-GPU jobs fill node 0; team b holds node 1, its whole quota, so nothing can be borrowed.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard.sched.cluster import ClusterState, Node
from trainyard.sched.engine import EngineParams, TrainyardPolicy
from trainyard.sched.types import JobRequest, Quota, Reason, Team
from trainyard.sim.simulator import simulate
from trainyard.sim.workload import SimJob, Workload

from tests.sched.builders import CLASSES, nodes, pending, req, running, snapshot, teams
from tests.sched.test_reclaim import after

ENGINE = TrainyardPolicy(EngineParams(share_below_gpu_s=None))  # the rule alone, time-sharing (5b) off
OVERDUE_AFTER = 0.25 * 86400  # EngineParams.overdue_at x the training class's max wait
NOW = 30 * 3600.0
BIG = 1


def _case(pending_for: float = OVERDUE_AFTER + 60, small_submit: float | None = None, small_gpus: int = 1,
          small_cls: str = "training", started_ago: float = 3600.0, big_gpus: int = 8):
    """Team a's 8-GPU job, pending `pending_for`; a's jobs on node 0 (`small_gpus` each, submitted
    at `small_submit`: by default after the big job) started `started_ago`; b on node 1."""
    ns, tm = nodes(2), teams(a=8, b=8)
    state = ClusterState(ns)
    big_submit = NOW - pending_for
    submit = big_submit + 60 if small_submit is None else small_submit
    run = [running(state, req(200, "b", gpus=8, gpus_per_node=8, min_nodes=1, max_nodes=1, est_runtime_s=NOW + 86400),
                   start=0.0, at=((1, tuple(range(8))),))]
    for k in range(8 // small_gpus):
        gis = tuple(range(k * small_gpus, (k + 1) * small_gpus))
        run.append(running(state, req(100 + k, "a", small_cls, gpus=small_gpus, submit=submit, est_runtime_s=86400),
                           start=NOW - started_ago, at=((0, gis),)))
    big = pending(req(BIG, "a", gpus=big_gpus, gpus_per_node=big_gpus if big_gpus <= 8 else 8, min_nodes=1 if big_gpus <= 8 else 2,
                      max_nodes=1 if big_gpus <= 8 else 2, submit=big_submit, est_runtime_s=3600))
    return snapshot(ns, tm, run, [big], now=NOW)


def _stopped(res) -> list[tuple[int, str, int]]:
    return sorted((p.job_id, p.reason, p.for_job) for p in res.preemptions)


def test_an_overdue_job_takes_its_place_back_from_its_teams_smaller_younger_jobs():
    res = ENGINE.cycle(_case())
    assert _stopped(res) == [(100 + k, "overdue", BIG) for k in range(8)]
    assert res.pending[BIG].reason == Reason.PREEMPTING


def test_while_it_waits_its_teams_younger_smaller_jobs_do_not_start():
    """The victims are still within their min run time (started 5 minutes ago): none can be
    stopped yet, and a free GPU of the team's is not refilled by a younger, smaller job — for one
    min run time and grace, after which the team's quota is not kept idle any longer."""
    snap = _case(started_ago=300.0)
    gone = snap.running.pop()  # one of a's jobs has ended: a GPU of a's quota is free
    snap = snapshot(snap.cluster.nodes, snap.teams, snap.running, snap.pending, now=NOW)
    young = pending(req(50, "a", submit=NOW - 60, est_runtime_s=600))
    old = pending(req(51, "a", submit=0.0, est_runtime_s=600))  # submitted before the big job
    res = ENGINE.cycle(snapshot(snap.cluster.nodes, snap.teams, snap.running, [*snap.pending, young, old], now=NOW))
    assert gone.req.id != BIG and not res.preemptions
    assert res.pending[50].reason == Reason.RESERVATION
    assert [s.job_id for s in res.starts] == [51]
    late = _case(pending_for=OVERDUE_AFTER + 600 + 120 + 60, started_ago=300.0)
    late.running.pop()
    res = ENGINE.cycle(snapshot(late.cluster.nodes, late.teams, late.running, [*late.pending, young], now=NOW))
    assert [s.job_id for s in res.starts] == [50]


def test_not_before_it_is_overdue():
    res = ENGINE.cycle(_case(pending_for=OVERDUE_AFTER - 60))
    assert not res.preemptions and res.pending[BIG].reason == Reason.QUOTA


def test_never_off_params():
    res = TrainyardPolicy(EngineParams(overdue_at=None)).cycle(_case())
    assert not res.preemptions


def test_jobs_submitted_before_it_are_not_stopped():
    res = ENGINE.cycle(_case(small_submit=0.0))
    assert not res.preemptions


def test_jobs_as_large_as_it_are_not_stopped():
    """Two 4-GPU jobs for a 4-GPU overdue job: same size, so its order (shortest first) stands."""
    res = ENGINE.cycle(_case(small_gpus=4, big_gpus=4))
    assert not res.preemptions


def test_higher_priority_jobs_and_jobs_in_their_min_run_time_are_not_stopped():
    assert not ENGINE.cycle(_case(small_cls="interactive")).preemptions
    assert not ENGINE.cycle(_case(started_ago=300.0)).preemptions  # min run time 10 min


def test_no_overdue_stop_for_a_job_larger_than_its_teams_quota():
    """16 GPUs for a quota of 8: it can only ever borrow, its own team's GPUs would not do."""
    assert not ENGINE.cycle(_case(big_gpus=16)).preemptions


def test_the_victims_do_not_stop_it_back():
    """Once stopped, the victims are pending (for a moment: not overdue) and smaller than the
    job they were stopped for and submitted after it: it starts, and nothing stops it again."""
    snap = _case()
    res = ENGINE.cycle(snap)
    nxt = after(snap, res, NOW + 130)  # the victims' grace has passed
    res2 = ENGINE.cycle(nxt)
    assert [s.job_id for s in res2.starts] == [BIG] and not res2.preemptions
    # ... also once they have waited past the overdue threshold themselves
    later = after(nxt, res2, NOW + 130 + OVERDUE_AFTER + 3600)
    assert not [p for p in ENGINE.cycle(later).preemptions if p.job_id == BIG]


# -- in the simulator -----------------------------------------------------------------------------

def _stream_workload(small: list[tuple[float, int, float, float]], big_at: float, big_gpus: int) -> Workload:
    """Team a (quota 8): a stream of small jobs (submit, GPUs, true run time, estimate) and, at
    `big_at`, one job of `big_gpus` on one node; team b (quota 8): one 40-hour 8-GPU job."""
    jobs = [SimJob(JobRequest(1, "b", "training", 0.0, gpus=8, gpus_per_node=8, min_nodes=1, max_nodes=1,
                              est_runtime_s=40 * 3600, checkpoint_interval_s=600), 40 * 3600)]
    for k, (t, g, dur, est) in enumerate(small):
        jobs.append(SimJob(JobRequest(100 + k, "a", "training", t, gpus=g, est_runtime_s=est,
                                      checkpoint_interval_s=600), dur))
    jobs.append(SimJob(JobRequest(10_000, "a", "training", big_at, gpus=big_gpus, gpus_per_node=big_gpus,
                                  min_nodes=1, max_nodes=1, est_runtime_s=3600, checkpoint_interval_s=600), 3600))
    jobs.sort(key=lambda j: (j.req.submit_time, j.req.id))
    tm = {"a": Team("a", "lab", {"default": Quota(8)}), "b": Team("b", "lab", {"default": Quota(8)})}
    return Workload([Node("n0", 8, 80 * 1024), Node("n1", 8, 80 * 1024)], tm, CLASSES, jobs)


def _bound(small) -> float:
    """Overdue after a quarter of its max wait; then its team's older jobs end by themselves (at
    most the longest run time) and the younger ones are stopped once past their min run time,
    within their grace; plus a few cycles."""
    longest = max(dur for _, _, dur, _ in small)
    return OVERDUE_AFTER + max(longest, CLASSES["training"].min_run_s) + CLASSES["training"].grace_s + 120


def test_a_stream_of_small_jobs_no_longer_starves_its_teams_large_job():
    """The regression case: a's 1-GPU, 30-minute jobs arrive every 4 minutes for 20 hours and
    keep its quota full; its 8-GPU job waited until the stream ended (20.2 h), now 6 h and a bit."""
    stream = [(t, 1, 1800.0, 1800.0) for t in range(0, 20 * 3600, 240)]
    res = simulate(_stream_workload(stream, 1000.0, 8), ENGINE)
    big = next(r for r in res.jobs if r.id == 10_000)
    assert big.first_start is not None and big.first_start - 1000.0 <= _bound(stream)
    off = simulate(_stream_workload(stream, 1000.0, 8), TrainyardPolicy(EngineParams(overdue_at=None)))
    assert next(r for r in off.jobs if r.id == 10_000).first_start - 1000.0 > 20 * 3600  # what it was


@st.composite
def streams(draw):
    """A team whose small jobs (1-2 GPUs, 5-60 minutes, estimates up to twice their true run
    time) keep coming for up to 12 hours; its large job (4-8 GPUs, within its quota) arrives in
    the first hour."""
    n = draw(st.integers(20, 150))
    gaps = draw(st.lists(st.floats(30, 600), min_size=n, max_size=n))
    small, t = [], 0.0
    for gap in gaps:
        t += gap
        dur = draw(st.floats(300, 3600))
        small.append((t, draw(st.integers(1, 2)), dur, dur * draw(st.floats(1.0, 2.0))))
    return small, draw(st.floats(0, 3600)), draw(st.integers(4, 8))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams())
def test_property_a_large_jobs_wait_is_bounded(case):
    small, big_at, big_gpus = case
    res = simulate(_stream_workload(small, big_at, big_gpus), ENGINE)
    big = next(r for r in res.jobs if r.id == 10_000)
    assert big.first_start is not None and big.first_start - big_at <= _bound(small), \
        (big.first_start - big_at, _bound(small))
