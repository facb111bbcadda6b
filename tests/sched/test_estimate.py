"""Start-time estimates with learned run times (sched/estimate.py, `JobRequest.expected_runtime_s`):
the estimate assumes the learned run time where a job has one, a running job past it is assumed to
run to its limit, and no decision of a cycle moves when every job carries one (only step 7's
estimates read it)."""

from __future__ import annotations

from dataclasses import replace

from tests.sched.builders import nodes, pending, req, running, snapshot, teams
from trainyard.sched.cluster import ClusterState
from trainyard.sched.engine import TrainyardPolicy
from trainyard.sched.estimate import estimate_starts, run_time
from trainyard.sched.synthetic_snapshot import build_snapshot
from trainyard.sched.types import PendingJob, RunningJob, Snapshot


def one_node_full(expected: float | None, now: float = 100.0) -> Snapshot:
    ns = nodes(1)
    st = ClusterState(ns)
    run = [running(st, req(1, gpus=8, est_runtime_s=3600.0, expected_runtime_s=expected), start=0.0)]
    pend = [pending(req(2, gpus=8, submit=50.0, est_runtime_s=3600.0, expected_runtime_s=expected)),
            pending(req(3, gpus=8, submit=60.0, est_runtime_s=3600.0))]
    return snapshot(ns, teams(a=8), run, pend, now=now)


def test_the_learned_run_time_replaces_the_limit_where_there_is_one():
    assert run_time(req(1, est_runtime_s=3600.0)) == 3600.0
    assert run_time(req(1, est_runtime_s=3600.0, expected_runtime_s=600.0)) == 600.0
    snap = one_node_full(None)
    assert estimate_starts(snap, snap.pending, [], []) == {2: 3600.0, 3: 7200.0}
    snap = one_node_full(600.0)
    # job 1 ends at 600 (learned), job 2 runs its learned 600, job 3 (nothing learned) after it
    assert estimate_starts(snap, snap.pending, [], []) == {2: 600.0, 3: 1200.0}


def test_a_running_job_past_its_learned_run_time_is_assumed_to_run_to_its_limit():
    snap = one_node_full(600.0, now=900.0)
    assert estimate_starts(snap, snap.pending, [], [])[2] == 3600.0


def with_expected(snap: Snapshot, factor: float) -> Snapshot:
    def learned(r):  # noqa: ANN001, ANN202
        e = r.est_runtime_s
        return replace(r, expected_runtime_s=None if e is None else e * factor)
    run: list[RunningJob] = [replace(r, req=learned(r.req)) for r in snap.running]
    pend: list[PendingJob] = [replace(p, req=learned(p.req)) for p in snap.pending]
    return replace(snap, running=run, pending=pend)


def test_no_decision_moves_when_every_job_has_a_learned_run_time():
    snap = build_snapshot(nodes=60, pending=400, running=300, seed=4)
    before = TrainyardPolicy().cycle(snap)
    after = TrainyardPolicy().cycle(with_expected(snap, 0.3))
    assert before.starts == after.starts and before.preemptions == after.preemptions
    assert {j: p.reason for j, p in before.pending.items()} == {j: p.reason for j, p in after.pending.items()}
    moved = [j for j, p in before.pending.items() if p.est_start is not None and after.pending[j].est_start != p.est_start]
    assert moved and all(after.pending[j].est_start <= before.pending[j].est_start for j in moved)
