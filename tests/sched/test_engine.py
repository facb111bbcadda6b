"""Each rule of the trainyard engine, on small hand-built snapshots."""

from trainyard.sched.cluster import ClusterState, Node
from trainyard.sched.engine import EngineParams, TrainyardPolicy
from trainyard.sched.types import Reason

from tests.sched.builders import GB, nodes, pending, req, running, snapshot, teams

ENGINE = TrainyardPolicy()


def full_node_of(team_jobs, state, start=0.0, ckpts=None):
    out = []
    for k, (jid, team) in enumerate(team_jobs):
        ck = None if ckpts is None else ckpts[k]
        out.append(running(state, req(jid, team, est_runtime_s=10_000, checkpoint_interval_s=None), start=start, ckpt=ck))
    return out


def test_reclaim_takes_back_borrowed_gpus_choosing_least_lost_work():
    ns = nodes(1)
    state = ClusterState(ns)
    # b borrows 4 of a's GPUs; its jobs checkpointed at different times.
    run = full_node_of([(200 + i, "b") for i in range(8)], state, start=0.0, ckpts=[100, 900, 200, 300, 950, 400, 500, 600])
    tm = teams(a=4, b=4)
    res = ENGINE.cycle(snapshot(ns, tm, run, [pending(req(101, "a", submit=600))], now=1000.0))
    assert [p.job_id for p in res.preemptions] == [204]  # newest checkpoint: least work lost
    assert res.preemptions[0].reason == "reclaim" and res.preemptions[0].for_job == 101
    assert res.starts == []  # it starts once the victim has left
    assert res.pending[101].reason == Reason.PREEMPTING


def test_no_reclaim_from_a_team_within_its_nominal_quota():
    ns = nodes(1)
    state = ClusterState(ns)
    run = full_node_of([(200 + i, "b") for i in range(4)] + [(100 + i, "a") for i in range(4)], state)
    tm = teams(a=4, b=4)
    # a is at its nominal; its new job would borrow, so nobody is preempted for it.
    res = ENGINE.cycle(snapshot(ns, tm, run, [pending(req(109, "a"))], now=5000.0))
    assert res.preemptions == [] and res.starts == []
    assert res.pending[109].reason == Reason.QUOTA


def test_waiting_for_leaving_victims_does_not_preempt_again():
    ns = nodes(1)
    state = ClusterState(ns)
    run = full_node_of([(200 + i, "b") for i in range(8)], state)
    from dataclasses import replace
    run[0] = replace(run[0], preempting=True)
    tm = teams(a=4, b=4)
    res = ENGINE.cycle(snapshot(ns, tm, run, [pending(req(101, "a"))], now=5000.0))
    assert res.preemptions == []
    assert res.pending[101].reason == Reason.PREEMPTING


def test_min_run_time_protects_young_victims():
    ns = nodes(1)
    state = ClusterState(ns)
    run = full_node_of([(200 + i, "b") for i in range(8)], state, start=1000.0)
    tm = teams(a=4, b=4)
    young = ENGINE.cycle(snapshot(ns, tm, run, [pending(req(101, "a"))], now=1000.0 + 599))
    assert young.preemptions == []
    old = ENGINE.cycle(snapshot(ns, tm, run, [pending(req(101, "a"))], now=1000.0 + 601))
    assert len(old.preemptions) == 1


def test_non_preemptible_jobs_are_never_victims():
    ns = nodes(1)
    state = ClusterState(ns)
    run = [running(state, req(200 + i, "b", cls="interactive")) for i in range(8)]
    tm = teams(a=4, b=4)
    res = ENGINE.cycle(snapshot(ns, tm, run, [pending(req(101, "a", cls="interactive"))], now=9000.0))
    assert res.preemptions == []


def test_priority_preempts_own_lower_priority_job_but_not_another_teams_in_quota_job():
    ns = nodes(1)
    state = ClusterState(ns)
    run = [running(state, req(100 + i, "a", cls="batch")) for i in range(4)]
    run += [running(state, req(200 + i, "b", cls="batch")) for i in range(4)]
    tm = teams(a=4, b=4)
    res = ENGINE.cycle(snapshot(ns, tm, run, [pending(req(150, "a", cls="interactive"))], now=100.0))
    assert len(res.preemptions) == 1
    assert res.preemptions[0].job_id in range(100, 104) and res.preemptions[0].reason == "priority"  # one of a's


def test_borrowing_limit_caps_a_team():
    ns = nodes(1)
    tm = teams(a=(4, 2, None), b=4)
    pend = [pending(req(100 + i, "a", submit=i)) for i in range(8)]
    res = ENGINE.cycle(snapshot(ns, tm, [], pend))
    assert len(res.starts) == 6
    assert all(res.pending[100 + i].reason == Reason.QUOTA for i in range(8) if 100 + i not in {s.job_id for s in res.starts})


def test_lending_limit_caps_what_others_borrow():
    ns = nodes(1)
    tm = teams(a=4, b=(4, None, 1))
    pend = [pending(req(100 + i, "a", submit=i)) for i in range(8)]
    res = ENGINE.cycle(snapshot(ns, tm, [], pend))
    assert len(res.starts) == 5


def test_team_without_cohort_never_borrows():
    from trainyard.sched.types import Quota, Team
    ns = nodes(1)
    tm = {"a": Team("a", None, {"default": Quota(2)}), "b": Team("b", None, {"default": Quota(6)})}
    res = ENGINE.cycle(snapshot(ns, tm, [], [pending(req(100 + i, "a", submit=i)) for i in range(4)]))
    assert len(res.starts) == 2


def test_gang_is_all_or_nothing():
    ns = nodes(2)
    state = ClusterState(ns)
    run = [running(state, req(201, "b", gpus=4))]
    tm = teams(a=16, b=16)
    gang = req(101, "a", gpus=16, gpus_per_node=8, min_nodes=2, max_nodes=2)
    res = ENGINE.cycle(snapshot(ns, tm, run, [pending(gang)]))
    assert res.starts == []
    assert res.pending[101].reason in (Reason.CAPACITY, Reason.TOPOLOGY)


def test_elastic_job_starts_at_the_size_that_fits_and_larger_when_room():
    ns = nodes(2)
    state = ClusterState(ns)
    run = [running(state, req(201, "b", gpus=8))]
    tm = teams(a=16, b=16)
    el = req(101, "a", gpus=8, gpus_per_node=8, min_nodes=1, max_nodes=2)
    res = ENGINE.cycle(snapshot(ns, tm, run, [pending(el)]))
    assert [s.placement.gpus for s in res.starts] == [8]
    res2 = ENGINE.cycle(snapshot(ns, tm, [], [pending(el)]))
    assert [s.placement.gpus for s in res2.starts] == [16]


def test_memory_fit_and_sharing():
    ns = [Node("small", 1, 40 * GB), Node("big", 1, 80 * GB)]
    tm = teams(a=2)
    res = ENGINE.cycle(snapshot(ns, tm, [], [pending(req(160, "a", gpu_mem_mib=60 * GB))]))
    assert res.starts[0].placement.node_indices == (1,)
    res = ENGINE.cycle(snapshot(ns, tm, [], [pending(req(199, "a", gpu_mem_mib=100 * GB))]))
    assert res.starts == [] and res.pending[199].reason == Reason.MEMORY
    # Three 30 GB jobs on one 80 GB GPU: two share it, the third waits for memory.
    one = [Node("big", 1, 80 * GB)]
    pend = [pending(req(100 + i, "a", gpu_mem_mib=30 * GB, submit=i)) for i in range(3)]
    res = ENGINE.cycle(snapshot(one, teams(a=3), [], pend))  # each job counts one GPU of quota
    assert len(res.starts) == 2
    assert res.pending[102].reason == Reason.MEMORY


def test_multi_node_job_stays_inside_one_block_and_rack_when_it_can():
    ns = nodes(8, per_rack=2, per_block=4)  # b0: n0..n3 (r0, r1); b1: n4..n7 (r2, r3)
    state = ClusterState(ns)
    run = [running(state, req(200, "b", gpus=1), at=((0, (0,)),)), running(state, req(205, "b", gpus=1), at=((5, (0,)),))]
    tm = teams(a=64, b=64)
    gang = req(101, "a", gpus=16, gpus_per_node=8, min_nodes=2, max_nodes=2)
    res = ENGINE.cycle(snapshot(ns, tm, run, [pending(gang)]))
    chosen = set(res.starts[0].placement.node_indices)
    racks = {ns[i].rack for i in chosen}
    assert len(racks) == 1  # one rack, a whole one left free: r1 (n2, n3) or r3 (n6, n7)
    three = req(103, "a", gpus=24, gpus_per_node=8, min_nodes=3, max_nodes=3)
    res = ENGINE.cycle(snapshot(ns, tm, run, [pending(three)]))
    assert len({ns[i].block for i in res.starts[0].placement.node_indices}) == 1


def test_backfill_never_delays_a_reservation():
    ns = nodes(1)
    state = ClusterState(ns)
    run = [running(state, req(201, "b", gpus=4, est_runtime_s=1000.0), start=0.0)]
    tm = teams(a=8, b=8)
    now = 100.0
    # Urgent: waited 13 h of a 24 h max wait.
    urgent = pending(req(101, "a", gpus=8, submit=now - 13 * 3600, est_runtime_s=3600.0))
    short = pending(req(102, "a", gpus=2, submit=now, est_runtime_s=500.0))
    long = pending(req(103, "a", gpus=2, submit=now, est_runtime_s=50_000.0))
    res = ENGINE.cycle(snapshot(ns, tm, run, [urgent, long, short], now=now))
    assert [r.job_id for r in res.reservations] == [101]
    assert res.reservations[0].start_at == 1000.0
    assert [s.job_id for s in res.starts] == [102]  # ends at 600, before the shadow time
    assert res.pending[103].reason == Reason.RESERVATION


def test_two_urgent_gangs_reserve_two_nodes_not_the_same_one_twice():
    """Each reservation holds its GPUs from the later ones, also once the running jobs there end:
    the second urgent 8-GPU job is reserved on the node that frees up next (both used to reserve
    the first node at its shadow time, so only one node ever drained)."""
    ns = nodes(2)
    state = ClusterState(ns)
    run = [running(state, req(201, "b", gpus=1, est_runtime_s=1000.0), at=((0, (0,)),)),
           running(state, req(202, "b", gpus=1, est_runtime_s=2000.0), at=((1, (0,)),))]
    tm = teams(a=16, b=16)
    now = 100.0
    urgent = [pending(req(101 + k, "a", gpus=8, gpus_per_node=8, min_nodes=1, max_nodes=1, submit=now - 13 * 3600 + k,
                          est_runtime_s=3600.0)) for k in range(2)]
    res = TrainyardPolicy(EngineParams(move_for_gangs=False)).cycle(snapshot(ns, tm, run, urgent, now=now))
    assert sorted((r.job_id, r.start_at, r.nodes) for r in res.reservations) == [(101, 1000.0, (0,)), (102, 2000.0, (1,))]


def test_an_urgent_job_waiting_for_gpu_memory_gets_a_reservation():
    """Waiting for memory other jobs hold is waiting like any other: the urgent job is reserved
    for at their end (it used to get none, so backfill could hold it past its max wait). A job
    no GPU could ever hold gets none."""
    ns = nodes(1)
    state = ClusterState(ns)
    held = [running(state, req(200 + g, "b", gpus=1, gpu_mem_mib=60 * GB, est_runtime_s=1000.0 + g), at=None)
            for g in range(8)]
    tm = teams(a=8, b=8)
    now = 100.0
    urgent = pending(req(101, "a", gpus=8, gpu_mem_mib=40 * GB, submit=now - 13 * 3600, est_runtime_s=3600.0))
    res = ENGINE.cycle(snapshot(ns, tm, held, [urgent], now=now))
    assert res.pending[101].reason == Reason.RESERVATION
    assert [(r.job_id, r.start_at) for r in res.reservations] == [(101, 1007.0)]
    never = pending(req(102, "a", gpus=1, gpu_mem_mib=100 * GB, submit=now - 13 * 3600, est_runtime_s=3600.0))
    res = ENGINE.cycle(snapshot(ns, tm, held, [never], now=now))
    assert res.reservations == [] and res.pending[102].reason == Reason.MEMORY


def test_a_claim_on_leaving_gpus_counts_the_starts_made_before_it():
    """A job may claim GPUs that a leaving job frees if its team's quota, once that job has
    gone, has room. A job of the same team started earlier in the cycle takes some of that room
    (the future ledger missed such starts, and the claim broke the team's quota)."""
    ns = nodes(2)
    state = ClusterState(ns)
    leaving = running(state, req(100, "a", cls="batch", gpus=2), preempting=True)
    tm = teams(a=(4, 0, None), b=(4, 0, None))  # no borrowing
    now = 1000.0
    first = pending(req(201, "b", cls="interactive", gpus=20, submit=now))  # looks at the future first
    starts = pending(req(101, "a", gpus=2, submit=now - 100))
    claims = pending(req(102, "a", gpus=4, submit=now))
    res = ENGINE.cycle(snapshot(ns, tm, [leaving], [first, starts, claims], now=now))
    assert [s.job_id for s in res.starts] == [101]
    assert res.pending[102].reason == Reason.QUOTA  # 2 (101) + 4 > 4, with 100 gone or not


def test_aging_puts_a_long_waiting_job_first():
    ns = nodes(1)
    state = ClusterState(ns)
    run = [running(state, req(201, "b", gpus=7, est_runtime_s=1e6))]
    tm = teams(a=8, b=8)
    now = 50 * 3600.0
    old_long = pending(req(101, "a", submit=now - 13 * 3600, est_runtime_s=1e5))
    new_short = pending(req(102, "a", submit=now - 60, est_runtime_s=600))
    res = ENGINE.cycle(snapshot(ns, tm, run, [new_short, old_long], now=now))
    assert [s.job_id for s in res.starts] == [101]
    # Without the wait, shortest first.
    young_long = pending(req(101, "a", submit=now - 3600, est_runtime_s=1e5))
    res = ENGINE.cycle(snapshot(ns, tm, run, [new_short, young_long], now=now))
    assert [s.job_id for s in res.starts] == [102]


def test_priority_orders_before_size():
    ns = nodes(1)
    state = ClusterState(ns)
    run = [running(state, req(100, "a", gpus=7, cls="interactive"))]
    tm = teams(a=8)
    pend = [pending(req(101, "a", cls="batch", est_runtime_s=60)), pending(req(102, "a", est_runtime_s=1e5))]
    res = ENGINE.cycle(snapshot(ns, tm, run, pend))
    assert [s.job_id for s in res.starts] == [102]  # the training job


def test_every_pending_job_gets_a_reason_and_an_estimate():
    ns = nodes(1)
    state = ClusterState(ns)
    run = [running(state, req(100, "a", gpus=8, est_runtime_s=1000.0))]
    tm = teams(a=8)
    pend = [pending(req(101 + i, "a", gpus=4, est_runtime_s=500.0, submit=i)) for i in range(3)]
    res = ENGINE.cycle(snapshot(ns, tm, run, pend, now=10.0))
    assert set(res.pending) == {101, 102, 103}
    starts = sorted(res.pending[j].est_start for j in res.pending)
    assert starts == [1000.0, 1000.0, 1500.0]
    assert all(info.reason in (Reason.CAPACITY, Reason.QUOTA) for info in res.pending.values())


def test_held_jobs_never_start():
    ns = nodes(1)
    res = ENGINE.cycle(snapshot(ns, teams(a=8), [], [pending(req(101, "a"), held=True)]))
    assert res.starts == [] and res.pending[101].reason == Reason.HELD


def test_reclaim_waits_for_natural_turnover_first():
    ns = nodes(1)
    state = ClusterState(ns)
    run = full_node_of([(200 + i, "b") for i in range(8)], state)
    tm = teams(a=4, b=4)
    fresh = ENGINE.cycle(snapshot(ns, tm, run, [pending(req(101, "a", submit=5000 - 30))], now=5000.0))
    assert fresh.preemptions == []
    assert fresh.pending[101].reason == Reason.CAPACITY
    patient = ENGINE.cycle(snapshot(ns, tm, run, [pending(req(101, "a", submit=5000 - 61))], now=5000.0))
    assert len(patient.preemptions) == 1


def test_a_job_not_yet_patient_does_not_stop_a_patient_one_from_reclaiming():
    """Regression: a failed victim search is remembered for jobs of the same shape, and the
    patience the job has waited out is part of that shape. A short job of the owed team that
    waited past the batch class's patience but not the training class's came first in order,
    found no victim among b's training jobs, and made the older job of the same shape skip its
    search; the owed team stayed below its quota (35 minutes in the Philly week of Sep 30)."""
    ns = nodes(1)
    state = ClusterState(ns)
    run = full_node_of([(200 + i, "b") for i in range(8)], state)
    tm = teams(a=4, b=4)
    young = pending(req(101, "a", submit=5000 - 30, est_runtime_s=600.0))  # first in order: shorter
    old = pending(req(102, "a", submit=5000 - 100, est_runtime_s=3600.0))
    res = ENGINE.cycle(snapshot(ns, tm, run, [young, old], now=5000.0))
    assert [p.for_job for p in res.preemptions] == [102]
    assert res.pending[102].reason == Reason.PREEMPTING and res.pending[101].reason == Reason.CAPACITY


def test_quota_freed_by_leaving_victims_goes_to_the_job_they_leave_for_only():
    from dataclasses import replace
    ns = nodes(1)
    state = ClusterState(ns)
    run = [running(state, req(100 + i, "a", cls="batch")) for i in range(4)]
    run[0] = replace(run[0], preempting=True)  # chosen last cycle for the interactive job
    from trainyard.sched.types import Quota, Team
    tm = {"a": Team("a", None, {"default": Quota(4)})}  # 4 GPUs stay free, but not a's to use
    pend = [pending(req(150, "a", cls="interactive")), pending(req(151, "a", cls="batch", submit=1))]
    res = ENGINE.cycle(snapshot(ns, tm, run, pend, now=100.0))
    assert res.preemptions == []  # no second victim for the same job
    assert res.pending[150].reason == Reason.PREEMPTING
    assert res.starts == []  # the batch job may not use the quota the victim still holds


def test_ties_go_to_the_lower_id_as_a_number():
    """Equal in every other key (array tasks are stored together, alike), the lower id goes first:
    9 before 10. With string ids ("10" < "9") the control loop's engine ran task 10 first."""
    ns = nodes(1, gpus=1)
    alike = [pending(req(jid, "a", submit=5.0, est_runtime_s=600.0)) for jid in (10, 9, 100)]
    res = ENGINE.cycle(snapshot(ns, teams(a=1), [], alike, now=10.0))
    assert [s.job_id for s in res.starts] == [9]
