"""Reclaim rules of issue 20: whole-gang reclaim (part 9) and no ping-pong (part 8).

Classes are the builders' (interactive 300, not preemptible; training 200, min run 10 min, grace
2 min; batch 100, no min run, grace 1 min). The engine's patience before reclaiming from a batch
job is min(60 s, 0.4 x (60 s grace + 0 s min run)) = 24 s.
"""

from dataclasses import replace

from trainyard.sched.cluster import ClusterState
from trainyard.sched.engine import TrainyardPolicy
from trainyard.sched.types import PendingJob, Reason, RunningJob, Snapshot

from tests.sched.builders import nodes, pending, req, running, snapshot, teams

ENGINE = TrainyardPolicy()


def requeue(v: RunningJob, now: float) -> PendingJob:
    """A victim that has left: pending again from `now`, with its attained service."""
    return PendingJob(v.req, attempt=v.attempt + 1, queued_since=now,
                      attained_gpu_s=v.attained_gpu_s + (now - v.start_time) * v.gpus)


def after(snap: Snapshot, res, now: float) -> Snapshot:
    """The next snapshot: this cycle's victims have left and are pending again, its starts run."""
    gone = {p.job_id for p in res.preemptions}
    pend = {pj.req.id: pj for pj in snap.pending}
    run = [r for r in snap.running if r.req.id not in gone]
    for s in res.starts:
        run.append(RunningJob(pend.pop(s.job_id).req, s.placement, snap.now, snap.now))
    back = [requeue(r, now) for r in snap.running if r.req.id in gone]
    state = ClusterState.build(snap.cluster.nodes, [r.placement for r in run])
    return replace(snap, now=now, cluster=state, running=run, pending=list(pend.values()) + back,
                   allocated=None, allocated_by_class=None)


# -- part 9: a team owed its quota gets it back from a gang larger than what its team borrows ----


def _gang_case(now: float, ckpts=(0.0,)):
    """2 nodes x 4 GPUs. Team a (nominal 3) runs 8-GPU batch gangs, borrowing 5 GPUs; team b
    (nominal 5) submits a 2-GPU interactive job at t=1000, inside its nominal quota."""
    ns = nodes(2, gpus=4, per_rack=2, per_block=1)
    state = ClusterState(ns)
    run = [running(state, req(100 + k, "a", "batch", gpus=4, gpus_per_node=4, min_nodes=1, max_nodes=1,
                              est_runtime_s=7200.0), start=0.0, ckpt=c) for k, c in enumerate(ckpts)]
    if len(ckpts) == 1:  # one gang of 2 nodes
        state = ClusterState(ns)
        run = [running(state, req(100, "a", "batch", gpus=8, gpus_per_node=4, min_nodes=2, max_nodes=2,
                                  est_runtime_s=7200.0), start=0.0, ckpt=ckpts[0])]
    tm = teams(a=3, b=5)
    return snapshot(ns, tm, run, [pending(req(200, "b", "interactive", gpus=2, submit=1000.0))], now=now)


def test_a_partly_borrowed_gang_is_reclaimed_whole():
    res = ENGINE.cycle(_gang_case(now=1000.0 + 30))  # waited 30 s: past the 24 s patience
    # a borrows 5 of its gang's 8 GPUs: the strict budget finds no victim; the gang goes whole.
    assert [(p.job_id, p.for_job) for p in res.preemptions] == [(100, 200)]
    assert res.pending[200].reason == Reason.PREEMPTING


def test_the_owed_job_starts_within_grace_plus_min_run_time():
    # Reclaim at 1,024 s at the latest (patience), the gang leaves within its grace (60 s):
    # the interactive job starts by 1,000 + 60 + 0 s plus one cycle.
    snap = _gang_case(now=1024.0)
    res = ENGINE.cycle(snap)
    assert [p.job_id for p in res.preemptions] == [100]
    nxt = ENGINE.cycle(after(snap, res, now=1024.0 + 30))
    assert [s.job_id for s in nxt.starts] == [200]
    assert nxt.preemptions == []


def test_before_its_patience_an_owed_job_does_not_stop_a_whole_gang():
    res = ENGINE.cycle(_gang_case(now=1000.0 + 10))
    assert res.preemptions == []


def test_among_whole_jobs_the_one_that_loses_least_is_stopped():
    # a runs two 4-GPU gangs (nominal 3: it borrows 5, less than... both are within 8): a 4-GPU
    # job of a is a strict victim only if a borrows 4 or more at its level; it borrows 5, so one
    # gang is a strict victim: the one checkpointed last (less work lost).
    res = ENGINE.cycle(_gang_case(now=1030.0, ckpts=(900.0, 1000.0)))
    assert [p.job_id for p in res.preemptions] == [101]


def test_whole_job_reclaim_never_takes_more_than_needed():
    # b is owed 2 GPUs; a borrows 5 with two 4-GPU jobs. Stopping one suffices (a keeps 4 >= 3).
    res = ENGINE.cycle(_gang_case(now=1030.0, ckpts=(1000.0, 900.0)))
    assert len(res.preemptions) == 1


# -- part 8: a job stopped by a reclaim does not come back before the job it was stopped for --


def _ping_pong_case():
    """1 node x 8 GPUs. Team y (nominal 4) runs two 4-GPU training jobs, borrowing 4; team x
    (nominal 4) has a 4-GPU batch job inside its quota, waiting since t=0."""
    ns = nodes(1)
    state = ClusterState(ns)
    run = [running(state, req(200, "y", "training", gpus=4, est_runtime_s=86400.0), start=0.0, ckpt=3000.0),
           running(state, req(201, "y", "training", gpus=4, est_runtime_s=86400.0), start=0.0, ckpt=3500.0)]
    tm = teams(x=4, y=4)
    return snapshot(ns, tm, run, [pending(req(100, "x", "batch", gpus=4, est_runtime_s=3600.0))], now=3600.0)


def test_reclaim_ping_pong_regression():
    # The case from the run against real Slurm: the batch job reclaims from the training job;
    # the next cycle the victim (higher class) used to restart on the very GPUs it left, get
    # reclaimed again, and the batch job never started.
    snap = _ping_pong_case()
    res = ENGINE.cycle(snap)
    assert [(p.job_id, p.reason, p.for_job) for p in res.preemptions] == [(201, "reclaim", 100)]
    nxt = ENGINE.cycle(after(snap, res, now=3600.0 + 130))
    assert [s.job_id for s in nxt.starts] == [100]  # the owed batch job, not the victim
    assert nxt.preemptions == []
    assert nxt.pending[201].reason == Reason.QUOTA  # it would have to borrow again


def test_a_borrowing_job_of_a_higher_class_waits_behind_a_job_inside_its_teams_quota():
    ns = nodes(1)
    state = ClusterState(ns)
    run = [running(state, req(200, "y", "training", gpus=4), start=0.0)]
    tm = teams(x=4, y=4)
    pend = [pending(req(201, "y", "training", gpus=4)), pending(req(100, "x", "batch", gpus=4))]
    res = ENGINE.cycle(snapshot(ns, tm, run, pend, now=100.0))
    assert [s.job_id for s in res.starts] == [100]


def test_reclaim_takes_a_teams_lowest_priority_work_first():
    # y (nominal 4) holds 4 GPUs of training and 4 of batch: it borrows only at the batch level,
    # so its training job is inside its quota and the batch job is the one reclaimed, even though
    # the training job checkpointed more recently.
    ns = nodes(1)
    state = ClusterState(ns)
    run = [running(state, req(200, "y", "training", gpus=4), start=0.0, ckpt=3590.0),
           running(state, req(201, "y", "batch", gpus=4), start=0.0, ckpt=0.0)]
    tm = teams(x=4, y=4)
    res = ENGINE.cycle(snapshot(ns, tm, run, [pending(req(100, "x", "batch", gpus=4))], now=3600.0))
    assert [p.job_id for p in res.preemptions] == [201]


def test_a_teams_higher_priority_job_is_in_quota_beside_its_lower_priority_work():
    # y (nominal 4) runs 4 GPUs of batch; its new training job fits beside them in its quota
    # (it may displace its own batch work), so it comes before x's borrowing job, submitted
    # earlier, for the 4 idle GPUs (w lends 2, x's own 2 are lendable to y).
    ns = nodes(1)
    state = ClusterState(ns)
    run = [running(state, req(201, "y", "batch", gpus=4), start=0.0)]
    tm = teams(x=2, y=4, w=2)
    pend = [pending(req(100, "x", "training", gpus=4, submit=0.0)), pending(req(200, "y", "training", gpus=4, submit=50.0))]
    res = ENGINE.cycle(snapshot(ns, tm, run, pend, now=100.0))
    assert [s.job_id for s in res.starts] == [200]


def test_a_job_stopped_for_its_teams_borrowing_higher_priority_job_restarts_after_it():
    # The `yard chaos preempt` case: x (nominal 4, may borrow 4) runs a 2-GPU training job and
    # submits a 7-GPU interactive one, which must take the training job's quota (2 + 7 > 8). Once
    # the training job has left, it is inside x's quota and the interactive job borrows, so the
    # order alone tries the victim first: it restarted on the GPUs it left and was preempted
    # again, 30 times in a row. Snapshot.stopped_for tries it after the job it was stopped for;
    # so does the order itself now: within a team, priority first (the next test).
    ns = nodes(1)
    state = ClusterState(ns)
    run = [running(state, req(2, "x", "training", gpus=2), start=0.0, ckpt=3590.0)]
    tm = teams(x=(4, 4, None), y=4)
    snap = snapshot(ns, tm, run, [pending(req(3, "x", "interactive", gpus=7, submit=3600.0))], now=3600.0)
    res = ENGINE.cycle(snap)
    assert [(p.job_id, p.reason, p.for_job) for p in res.preemptions] == [(2, "priority", 3)]
    nxt_snap = after(snap, res, now=3610.0)
    for nxt in (ENGINE.cycle(nxt_snap), ENGINE.cycle(replace(nxt_snap, stopped_for={2: 3}))):
        assert [s.job_id for s in nxt.starts] == [3]
        assert nxt.preemptions == []
        assert nxt.pending[2].reason == Reason.QUOTA  # 7 + 2 > 8: it waits for the interactive job


def _vs_slurm_cluster(holder: int, team: str):
    """bench/vs_slurm.py's cluster: 2 nodes x 4 GPUs, nominal a 4, b 2, c 2 in one cohort; one
    4-GPU training job (`holder`, of `team`) holds n0, n1 is free."""
    ns = nodes(2, gpus=4)
    state = ClusterState(ns)
    run = [running(state, req(holder, team, "training", gpus=4, est_runtime_s=600.0), start=0.0)]
    return ns, teams(a=4, b=2, c=2), run


def _vs_slurm_case(stopped_for: dict[int, int] | None = None) -> Snapshot:
    """From the run against real Slurm: a's 4-GPU training job holds n0. c waits with a 4-GPU
    training job (it must borrow b's 2 idle GPUs) and two batch jobs of 2 and 1 GPUs inside its
    quota."""
    ns, tm, run = _vs_slurm_cluster(100, "a")
    pend = [pending(req(300, "c", "training", gpus=4, submit=60.0, est_runtime_s=90.0)),
            pending(req(301, "c", "batch", gpus=2, submit=10.0, est_runtime_s=60.0)),
            pending(req(302, "c", "batch", gpus=1, submit=20.0, est_runtime_s=60.0))]
    return replace(snapshot(ns, tm, run, pend, now=100.0), stopped_for=stopped_for or {})


def test_within_a_team_a_higher_priority_borrowing_job_goes_before_its_in_quota_work():
    # The batch jobs are in c's quota and the training job borrows, so the tiers alone tried the
    # batch jobs first: they took 3 of the 4 GPUs c may hold, the training job then stopped them
    # (own team, lower priority), and the team's next batch job took the GPUs they left: six
    # batch jobs started and were stopped a second later, one after the other, for 8 s.
    res = ENGINE.cycle(_vs_slurm_case())
    assert [s.job_id for s in res.starts] == [300]
    assert res.preemptions == []
    assert res.pending[301].reason == res.pending[302].reason == Reason.QUOTA
    # The same once the batch jobs had been stopped for it.
    res = ENGINE.cycle(_vs_slurm_case(stopped_for={301: 300, 302: 300}))
    assert [s.job_id for s in res.starts] == [300] and res.preemptions == []


def test_a_reclaimed_job_back_inside_its_quota_is_not_held_behind_its_reclaimer():
    # a's training job was reclaimed for c's 2-GPU batch job (a then borrowed); a's other job has
    # ended since, so it is inside a's quota, while the batch job still waits behind c's own
    # training jobs. Held behind the batch job (stopped_for), it let c's borrowing training jobs
    # take the free node, and reclaimed each one a second later.
    ns, tm, run = _vs_slurm_cluster(300, "c")
    pend = [pending(req(101, "a", "training", gpus=4, submit=0.0, est_runtime_s=900.0)),
            pending(req(301, "c", "batch", gpus=2, submit=10.0, est_runtime_s=60.0)),
            pending(req(303, "c", "training", gpus=4, submit=90.0, est_runtime_s=90.0))]
    snap = replace(snapshot(ns, tm, run, pend, now=100.0), stopped_for={101: 301})
    res = ENGINE.cycle(snap)
    assert [s.job_id for s in res.starts] == [101]
    assert res.preemptions == []


# -- an attempt still being launched is no victim ------------------------------------------------

def test_a_borrowers_job_still_being_launched_is_not_stopped_for_a_reclaim():
    """On Slurm a launch takes seconds; a job chosen as a victim then got its notice only once it
    had started, and stopping it saved nothing. b borrows one node with a batch job (no min run
    time) whose launch is still in flight: a's in-quota job waits rather than stop it, and
    reclaims as soon as the job runs."""
    ns, tm = nodes(1), teams(a=8, b=0)
    state = ClusterState(ns)
    now = 10_000.0
    borrower = running(state, req(200, "b", "batch", gpus=8), start=now - 5, starting=True)
    owed = pending(req(100, "a", "batch", gpus=8, submit=now - 600))
    res = ENGINE.cycle(snapshot(ns, tm, [borrower], [owed], now=now))
    assert res.preemptions == [] and res.pending[100].reason != Reason.PREEMPTING
    started = replace(borrower, starting=False)
    res = ENGINE.cycle(snapshot(ns, tm, [started], [owed], now=now))
    assert [(p.job_id, p.reason) for p in res.preemptions] == [(200, "reclaim")]


def test_a_borrowing_job_whose_victims_have_left_gets_their_gpus_before_a_better_scored_borrower():
    # vs_slurm again: a holds its quota (n0); c's 4-GPU training job stopped c's batch job on n1,
    # which is free now. a's second 4-GPU training job borrows too and scores better (shorter),
    # and took the node c's job had stopped a job for; a reclaim stopped it a second later. The
    # borrowing job with victims in play goes first among the borrowers of its priority.
    ns, tm, run = _vs_slurm_cluster(100, "a")
    pend = [pending(req(137, "a", "training", gpus=4, submit=170.0, est_runtime_s=60.0)),
            pending(req(312, "c", "training", gpus=4, submit=60.0, est_runtime_s=600.0)),
            pending(req(334, "c", "batch", gpus=1, submit=30.0, est_runtime_s=60.0))]
    snap = replace(snapshot(ns, tm, run, pend, now=371.0), stopped_for={334: 312})
    res = ENGINE.cycle(snap)
    assert [s.job_id for s in res.starts] == [312]
    assert res.preemptions == []
    assert [s.job_id for s in ENGINE.cycle(replace(snap, stopped_for={})).starts] == [137]  # the order alone
