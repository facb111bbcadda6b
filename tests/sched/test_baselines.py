"""Behaviour tests for the baseline policies on small hand-built snapshots (real objects, no mocks)."""

from __future__ import annotations

import random

import pytest

from trainyard.sched.baselines import Fifo, Kueue, Partition, Slurm, Tiresias
from trainyard.sched.cluster import ClusterState, Node
from trainyard.sched.placement import place
from trainyard.sched.policy import _REGISTRY
from trainyard.sched.types import (
    JobClass,
    JobId,
    JobRequest,
    PendingJob,
    Quota,
    Reason,
    RunningJob,
    Snapshot,
    Team,
)

CLASSES = {
    "low": JobClass("low", priority=1),
    "mid": JobClass("mid", priority=5),
    "high": JobClass("high", priority=10, preemptible=False),
    "sticky": JobClass("sticky", priority=1, min_run_s=3600.0),
}
POLICIES = [Fifo, Partition, Slurm, Kueue, Tiresias]


def nodes(n: int, gpus: int = 8, pool: str = "default", blocks: int = 1) -> list[Node]:
    return [Node(f"n{i}", gpus, pool=pool, block=f"b{i % blocks}") for i in range(n)]


def req(jid: JobId, gpus: int = 1, team: str = "a", cls: str = "low", t: float = 0.0, **kw) -> JobRequest:
    return JobRequest(id=jid, team=team, job_class=cls, submit_time=t, gpus=gpus, **kw)


def pend(r: JobRequest, **kw) -> PendingJob:
    kw.setdefault("queued_since", r.submit_time)
    return PendingJob(req=r, **kw)


class Builder:
    """Start running jobs on nodes one by one (via real placement), then take a snapshot."""

    def __init__(self, ns: list[Node]):
        self.nodes = ns
        self.state = ClusterState(ns)
        self.running: list[RunningJob] = []

    def run(self, r: JobRequest, start: float, on: int | None = None, **kw) -> RunningJob:
        if on is not None:  # pin to one node: place on a view where only that node is free
            view = self.state.copy()
            for i in range(len(self.nodes)):
                if i != on:
                    view.set_health(i, False)
            p, why = place(view, r)
        else:
            p, why = place(self.state, r)
        assert p is not None, why
        self.state.allocate(p)
        job = RunningJob(req=r, placement=p, start_time=start, last_checkpoint=start, **kw)
        self.running.append(job)
        return job

    def snap(self, pending, now: float = 1000.0, teams=None, usage=None, explain=True) -> Snapshot:
        state = ClusterState.build(self.nodes, [r.placement for r in self.running])
        teams = teams or {"a": Team("a", quotas={"default": Quota(64)}), "b": Team("b", quotas={"default": Quota(64)})}
        return Snapshot(
            now=now,
            cluster=state,
            teams=teams,
            classes=CLASSES,
            running=tuple(self.running),
            pending=tuple(pending),
            usage=usage or {},
            explain=explain,
        )


def started(res) -> list[JobId]:
    return [s.job_id for s in res.starts]


def preempted(res) -> list[JobId]:
    return sorted(p.job_id for p in res.preemptions)


# -- registry ------------------------------------------------------------------------------------


def test_registered_names():
    for name in ["fifo", "partition", "slurm", "kueue", "tiresias"]:
        assert _REGISTRY[name]().name == name


# -- fifo ----------------------------------------------------------------------------------------


def test_fifo_head_of_line_blocking():
    b = Builder(nodes(1))
    b.run(req(1, 4), start=0)
    big = pend(req(2, 8, t=1.0), queued_since=900.0)  # requeued: keeps its submit-time place
    small = pend(req(3, 2, t=2.0), queued_since=5.0)
    res = Fifo().cycle(b.snap([small, big]))
    assert started(res) == []
    assert res.pending[2].reason is Reason.CAPACITY
    assert res.pending[3].reason is Reason.PRIORITY
    # Without the blocker, both start in order.
    res = Fifo().cycle(Builder(nodes(1)).snap([small, big]))
    assert started(res) == [2]  # 8 GPUs fill the node; small is then blocked
    held = pend(req(4, 8, t=0.0), held=True)
    res = Fifo().cycle(Builder(nodes(1)).snap([held, small]))
    assert started(res) == [3] and res.pending[4].reason is Reason.HELD


# -- partition -----------------------------------------------------------------------------------


def test_partition_caps_team_at_nominal_and_blocks_only_that_team():
    teams = {"a": Team("a", quotas={"default": Quota(8)}), "b": Team("b", quotas={"default": Quota(8)})}
    b = Builder(nodes(3))
    b.run(req(5, 4, team="a"), start=0)
    jobs = [
        pend(req(6, 16, team="a", t=0.5)),  # larger than the partition: skipped, never blocks
        pend(req(7, 8, team="a", t=1)),  # 4 + 8 > 8: blocked by its quota
        pend(req(8, 2, team="a", t=2)),  # would fit, but FIFO within the team
        pend(req(9, 8, team="b", t=3)),
        pend(req(10, 1, team="b", t=4)),  # b is at its nominal 8: no borrowing
    ]
    res = Partition().cycle(b.snap(jobs, teams=teams))
    assert started(res) == [9]
    assert res.pending[6].reason is Reason.QUOTA
    assert res.pending[7].reason is Reason.QUOTA
    assert res.pending[8].reason is Reason.PRIORITY
    assert res.pending[10].reason is Reason.QUOTA
    # 16 GPUs idle remain: the partition never lends them.
    assert sum(s.placement.gpus for s in res.starts) == 8


# -- slurm ---------------------------------------------------------------------------------------


def _backfill_setup(with_third_node: bool):
    b = Builder(nodes(3 if with_third_node else 2))
    b.run(req(11, 8, est_runtime_s=1100.0), start=0, on=0)  # ends at 1100
    b.run(req(12, 4, est_runtime_s=2000.0), start=0, on=1)  # ends at 2000
    if with_third_node:
        b.run(req(13, 4, est_runtime_s=9000.0), start=0, on=2)  # ends at 9000
    big = pend(req(2, gpus_per_node=8, min_nodes=2, max_nodes=2, t=0.0, est_runtime_s=500.0))
    long = pend(req(14, 4, t=10.0, est_runtime_s=5000.0))  # tried first (older), ends after
    short = pend(req(15, 4, t=20.0, est_runtime_s=500.0))  # ends at 1500 < shadow 2000
    return b, [long, short, big]


def test_slurm_easy_backfill_respects_reservation():
    b, jobs = _backfill_setup(with_third_node=False)
    snap = b.snap(jobs)
    res = Slurm().cycle(snap)
    assert [(r.job_id, r.start_at, r.nodes) for r in res.reservations] == [(2, 2000.0, (0, 1))]
    assert res.pending[2].est_start == 2000.0
    assert started(res) == [15]  # ends before the shadow time
    assert res.pending[14].reason is Reason.RESERVATION  # would hold node 1 past the shadow
    assert res.preemptions == []

    # The reservation is not delayed: with the backfilled job running, the shadow time is the same.
    s = res.starts[0]
    short = next(j for j in jobs if j.req.id == 15)
    b.running.append(RunningJob(req=short.req, placement=s.placement, start_time=1000.0, last_checkpoint=1000.0))
    res2 = Slurm().cycle(b.snap([j for j in jobs if j is not short]))
    assert [(r.job_id, r.start_at) for r in res2.reservations] == [(2, 2000.0)]
    assert started(res2) == []


def test_slurm_backfills_long_job_on_gpus_the_reservation_does_not_need():
    b, jobs = _backfill_setup(with_third_node=True)
    res = Slurm().cycle(b.snap(jobs))
    assert [(r.job_id, r.start_at, r.nodes) for r in res.reservations] == [(2, 2000.0, (0, 1))]
    # Both fit now; 'long' can only go to node 2, whose GPUs the reservation does not need.
    assert sorted(started(res)) == [14, 15]
    where = {s.job_id: s.placement.node_indices for s in res.starts}
    assert where[14] == (2,)


def test_slurm_priority_weighs_fairshare_and_qos():
    b = Builder(nodes(1))
    b.run(req(1, 8), start=0)
    jobs = [pend(req(16, 8, team="a", t=0)), pend(req(17, 8, team="b", t=5)), pend(req(18, 8, team="b", cls="mid", t=9))]
    pol = Slurm()
    prio = pol.priorities(b.snap(jobs, usage={"a": 900.0, "b": 100.0}))
    assert prio[18] > prio[17] > prio[16]  # qos first, then b's lower usage


def test_slurm_qos_preemption_picks_youngest_and_waits():
    b = Builder(nodes(1))
    b.run(req(19, 4), start=0)
    b.run(req(20, 2), start=50)
    b.run(req(21, 2), start=100)
    urgent = pend(req(22, 4, cls="mid", t=500))
    res = Slurm().cycle(b.snap([urgent]))
    assert preempted(res) == [20, 21]
    assert all(p.for_job == 22 for p in res.preemptions)
    assert started(res) == [] and res.pending[22].reason is Reason.PREEMPTING
    # Next cycle the victims are still leaving: no new preemption, still waiting.
    b.running = [
        RunningJob(r.req, r.placement, r.start_time, r.last_checkpoint, preempting=r.req.id in (20, 21))
        for r in b.running
    ]
    res = Slurm().cycle(b.snap([urgent]))
    assert res.preemptions == [] and started(res) == []
    assert res.pending[22].reason is Reason.PREEMPTING


def test_slurm_never_preempts_unpreemptible_or_too_young():
    b = Builder(nodes(1))
    b.run(req(23, 4, cls="high"), start=0)
    b.run(req(24, 4, cls="sticky"), start=900)  # min_run_s 3600 not reached at now=1000
    top = pend(req(25, 8, cls="high", t=0))
    res = Slurm().cycle(b.snap([top]))
    assert res.preemptions == [] and started(res) == []


# -- kueue ---------------------------------------------------------------------------------------


def _cohort(a: Quota, b: Quota) -> dict[str, Team]:
    return {"a": Team("a", cohort="c", quotas={"default": a}), "b": Team("b", cohort="c", quotas={"default": b})}


def test_kueue_reclaims_borrowed_quota():
    teams = _cohort(Quota(8), Quota(8))
    b = Builder(nodes(2))
    b.run(req(26, 8, team="b"), start=0)
    b.run(req(27, 8, team="b"), start=100)  # b borrows 8 of a's idle nominal
    a1 = pend(req(16, 8, team="a", t=500))
    res = Kueue().cycle(b.snap([a1], teams=teams))
    assert preempted(res) == [27]  # most recently started of the borrower; b stays at nominal
    assert res.preemptions[0].reason == "reclaim" and res.preemptions[0].for_job == 16
    assert started(res) == [] and res.pending[16].reason is Reason.PREEMPTING


def test_kueue_does_not_preempt_team_at_its_nominal():
    teams = _cohort(Quota(8), Quota(8))  # nominal sums to 16 on an 8-GPU cluster
    b = Builder(nodes(1))
    b.run(req(28, 8, team="b"), start=0)
    res = Kueue().cycle(b.snap([pend(req(16, 8, team="a"))], teams=teams))
    assert res.preemptions == [] and started(res) == []


def test_kueue_borrowing_limit_and_best_effort():
    teams = _cohort(Quota(8), Quota(8, borrowing_limit=4))
    b = Builder(nodes(2))
    b.run(req(28, 8, team="b"), start=0)
    jobs = [
        pend(req(29, 8, team="b", t=1)),  # would borrow 8 > limit 4
        pend(req(30, 4, team="b", t=2)),  # borrows 4: fine, and not blocked by 29
        pend(req(31, 1, team="b", t=3)),  # would borrow 5
    ]
    res = Kueue().cycle(b.snap(jobs, teams=teams))
    assert started(res) == [30]
    assert res.pending[29].reason is Reason.QUOTA and res.pending[31].reason is Reason.QUOTA


def test_kueue_preempts_lower_priority_within_team():
    teams = _cohort(Quota(8), Quota(8))
    b = Builder(nodes(1))
    b.run(req(32, 8, team="a", cls="low"), start=0)
    res = Kueue().cycle(b.snap([pend(req(33, 8, team="a", cls="mid"))], teams=teams))
    assert preempted(res) == [32] and res.preemptions[0].reason == "priority"
    # Equal priority does not preempt.
    res = Kueue().cycle(b.snap([pend(req(34, 8, team="a", cls="low"))], teams=teams))
    assert res.preemptions == []


# -- tiresias ------------------------------------------------------------------------------------


def test_tiresias_preempts_most_attained_for_new_job():
    b = Builder(nodes(1))
    b.run(req(35, 4), start=0, attained_gpu_s=60_000.0)  # queue 1: past 16 GPU-hours
    b.run(req(36, 4), start=900)  # 400 GPU-s at now=1000: queue 0
    new = pend(req(37, 4, t=990))
    res = Tiresias().cycle(b.snap([new]))
    assert preempted(res) == [35] and res.preemptions[0].for_job == 37
    assert started(res) == [] and res.pending[37].reason is Reason.PREEMPTING


def test_tiresias_respects_min_run_and_starts_when_free():
    b = Builder(nodes(1))
    b.run(req(35, 4, cls="sticky"), start=0, attained_gpu_s=50_000.0)  # too young to preempt
    res = Tiresias().cycle(b.snap([pend(req(37, 8, t=990))]))
    assert res.preemptions == [] and started(res) == []
    res = Tiresias().cycle(b.snap([pend(req(37, 4, t=990))]))
    assert started(res) == [37]


def test_tiresias_promotes_starved_job():
    b = Builder(nodes(1))
    b.run(req(1, 8, t=850), start=900, attained_gpu_s=0.0)  # queue 0, 800 GPU-s, arrived after s
    starved = pend(req(38, 8, t=0), queued_since=100.0, attained_gpu_s=8 * 500.0)  # queue 1, ran 500 s
    pol = Tiresias((3200.0,), starve_limit=1.0)  # waited 900 s > 1 x 500 s: back to queue 0, and older
    res = pol.cycle(b.snap([starved]))
    assert preempted(res) == [1]
    res = Tiresias((3200.0,), starve_limit=4.0).cycle(b.snap([starved]))
    assert res.preemptions == []
    res = Tiresias((3200.0,), starve_limit=None).cycle(b.snap([starved]))  # no promotion at all
    assert res.preemptions == []


def test_tiresias_has_the_published_parameters_and_the_old_ones_another_name():
    from trainyard.sched.baselines import TiresiasShortQueue
    from trainyard.sched.policy import get_policy

    t = get_policy("tiresias")
    assert (t.thresholds, t.starve_limit) == ((16 * 3600.0,), None)  # as Pollux evaluated it
    old = get_policy("tiresias-3200")
    assert isinstance(old, TiresiasShortQueue) and (old.thresholds, old.starve_limit) == ((3200.0,), 4.0)
    assert old.name == "tiresias-3200"


# -- all policies --------------------------------------------------------------------------------


def random_snapshot(seed: int, explain: bool = True) -> Snapshot:
    rng = random.Random(seed)
    ns = [Node(f"n{i}", 8, gpu_mem_mib=80 * 1024, block=f"b{i % 3}", rack=f"r{i % 6}") for i in range(12)]
    teams = {
        "a": Team("a", cohort="c", quotas={"default": Quota(32, borrowing_limit=16)}),
        "b": Team("b", cohort="c", quotas={"default": Quota(40)}),
        "c": Team("c", quotas={"default": Quota(24)}),
    }
    b = Builder(ns)

    def rand_req(jid: JobId) -> JobRequest:
        kind = rng.random()
        common = dict(
            id=jid,
            team=rng.choice("abc"),
            job_class=rng.choice(list(CLASSES)),
            submit_time=float(rng.randrange(0, 900)),
            est_runtime_s=rng.choice([None, 300.0, 3000.0, 30000.0]),
        )
        if kind < 0.4:
            return JobRequest(gpus=rng.choice([1, 2, 4, 8, 12]), **common)
        if kind < 0.7:
            lo = rng.randint(1, 3)
            return JobRequest(gpus_per_node=rng.choice([4, 8]), min_nodes=lo, max_nodes=lo + rng.choice([0, 2]), **common)
        return JobRequest(gpus=rng.choice([1, 2]), gpu_mem_mib=rng.choice([10 * 1024, 20 * 1024, 40 * 1024]), **common)

    k = 0
    for _ in range(40):
        r = rand_req(k)  # running jobs 0..39, pending 40..99
        k += 1
        p, _ = place(b.state, r, r.min_nodes if r.gpus_per_node else None)
        if p is None:
            continue
        b.state.allocate(p)
        start = float(rng.randrange(0, 990))
        b.running.append(
            RunningJob(
                r, p, start, start, attained_gpu_s=rng.choice([0.0, 5000.0]), preempting=rng.random() < 0.1
            )
        )
    pending = []
    for _ in range(60):
        r = rand_req(k)
        k += 1
        pending.append(
            PendingJob(r, queued_since=r.submit_time + rng.choice([0.0, 50.0]), attained_gpu_s=rng.choice([0.0, 9000.0]), held=rng.random() < 0.05)
        )
    return b.snap(pending, teams=teams, usage={"a": 5e5, "b": 1e5}, explain=explain)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_deterministic(policy):
    for seed in range(3):
        r1 = policy().cycle(random_snapshot(seed))
        r2 = policy().cycle(random_snapshot(seed))
        assert r1 == r2
        quiet = policy().cycle(random_snapshot(seed, explain=False))
        assert quiet.pending == {}
        assert (quiet.starts, quiet.preemptions) == (r1.starts, r1.preemptions)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_never_over_allocates_or_breaks_rules(policy):
    for seed in range(8):
        snap = random_snapshot(seed)
        before = ([list(f) for f in snap.cluster.free_mib], list(snap.cluster.free_whole))
        res = policy().cycle(snap)
        assert ([list(f) for f in snap.cluster.free_mib], list(snap.cluster.free_whole)) == before  # untouched
        state = snap.cluster.copy()
        for s in res.starts:
            state.allocate(s.placement)  # raises on over-allocation
        pend = {j.req.id: j for j in snap.pending}
        run = {r.req.id: r for r in snap.running}
        ids = started(res)
        assert len(ids) == len(set(ids))
        for jid in ids:
            assert jid in pend and not pend[jid].held
            r = pend[jid].req
            assert [s.placement for s in res.starts if s.job_id == jid][0].gpus in (r.min_gpus, r.max_gpus)
        for p in res.preemptions:
            v = run[p.job_id]
            cls = CLASSES[v.req.job_class]
            assert not v.preempting and cls.preemptible and snap.now - v.start_time >= cls.min_run_s
            assert p.for_job not in ids  # the preemptor waits for its victims
        assert len(res.preemptions) == len({p.job_id for p in res.preemptions})
        for jid in pend:
            if jid not in ids:
                assert jid in res.pending


def test_quota_policies_respect_quota_on_random_snapshots():
    from trainyard.sched.quota import QuotaLedger

    for seed in range(8):
        snap = random_snapshot(seed)
        res = Kueue().cycle(snap)
        ledger = QuotaLedger(snap.teams, [(r.req.team, r.req.pool, r.gpus) for r in snap.running])
        pend = {j.req.id: j.req for j in snap.pending}
        for s in res.starts:
            r = pend[s.job_id]
            assert ledger.fits(r.team, r.pool, s.placement.gpus)
            ledger.add(r.team, r.pool, s.placement.gpus)


def test_may_fit_agrees_with_place():
    """The cheap pre-check the baselines use before `place`: never wrong, exact for whole GPUs."""
    from trainyard.sched.baselines._common import may_fit

    rng = random.Random(7)
    for seed in range(30):
        snap = random_snapshot(seed)
        state = snap.cluster.copy()
        for i in rng.sample(range(len(state.nodes)), 2):
            state.set_health(i, False)
        for k in range(40):
            if rng.random() < 0.5:
                r = req(1000 + k, gpus=rng.choice([1, 2, 3, 4, 6, 8, 9, 12, 16, 24, 40]))
            else:
                lo = rng.randint(1, 4)
                r = req(1000 + k, gpus_per_node=rng.choice([1, 2, 4, 8, 9]), min_nodes=lo, max_nodes=lo + 1)
            for n in ((None,) if r.gpus_per_node is None else (r.min_nodes, r.max_nodes)):
                fits = place(state, r, n)[0] is not None
                if (r.gpus_per_node or 0) > 8:  # larger than any node: left to `place`
                    assert not fits
                else:
                    assert may_fit(state, r, n) == fits
