"""The simulator's model: completion, preemption with lost work, failures, stuck queues, quota
episodes — each on a tiny workload whose outcome can be worked out by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainyard.sched.cluster import Node
from trainyard.sched.engine import TrainyardPolicy
from trainyard.sched.types import CycleResult, JobClass, JobRequest, Preempt, Quota, Snapshot, Start, Team
from trainyard.sched.placement import place
from trainyard.sim.result import metrics
from trainyard.sim.simulator import SimParams, simulate
from trainyard.sim.workload import SimJob, Workload

CLASSES = {"training": JobClass("training", 200, True, 86400, 0.0, None, 120.0)}


def workload(jobs, nodes=1, gpus=4, teams=None, measure_from=0.0):
    return Workload([Node(f"n{i}", gpus, 80 * 1024) for i in range(nodes)],
                    teams or {"a": Team("a", "c", {"default": Quota(nodes * gpus)})}, CLASSES, jobs,
                    measure_from=measure_from)


def job(jid, submit, duration, gpus=1, team="a", ckpt=600.0):
    return SimJob(JobRequest(jid, team, "training", submit, gpus=gpus, checkpoint_interval_s=ckpt), duration)


class Scripted:
    """A policy that starts whatever fits, in order, and preempts `victim` once at `when`."""

    name = "scripted"

    def __init__(self, victim=None, when=None):
        self.victim, self.when, self.done = victim, when, False

    def cycle(self, snap: Snapshot) -> CycleResult:
        res = CycleResult()
        if self.victim is not None and not self.done and snap.now >= self.when:
            if any(r.req.id == self.victim for r in snap.running):
                res.preemptions.append(Preempt(self.victim, "test", 0))  # for no job in particular
                self.done = True
                return res
        state = snap.cluster.copy()
        for pj in sorted(snap.pending, key=lambda p: p.req.id):
            pl, _ = place(state, pj.req)
            if pl is not None:
                state.allocate(pl)
                res.starts.append(Start(pj.req.id, pl))
        return res


def test_jobs_run_for_their_duration():
    res = simulate(workload([job(1, 0, 100.0), job(2, 10, 50.0, gpus=4)]), Scripted())
    by_id = {r.id: r for r in res.jobs}
    assert by_id[1].end == 100.0
    assert by_id[2].first_start == 100.0 and by_id[2].end == 150.0  # waits for the whole node
    m = metrics(res)
    assert m["completed"] == 2 and m["avg_wait_s"] == 45.0


def test_preemption_ignoring_the_notice_loses_work_since_the_last_checkpoint_and_resumes():
    # Checkpoints at 600 s of progress; preempted at 1000 s: 400 s lost, plus the 30 s it takes
    # to leave; the restart pays 60 s of overhead and redoes the rest (3000 - 600 s of work).
    # (Job 2's arrival at 1000 s makes the cycle in which the scripted policy preempts job 1.)
    jobs = [job(1, 0, 3000.0), job(2, 1000.0, 10.0)]
    wl = workload(jobs, gpus=8)
    wl.classes = {"training": replace(CLASSES["training"], checkpoint_on_notice=False)}
    res = simulate(wl, Scripted(1, 1000.0), SimParams(restart_overhead_s=60.0))
    r = next(r for r in res.jobs if r.id == 1)
    assert r.preemptions == 1
    stop = 1000.0 + 30.0
    assert r.end == stop + 60.0 + (3000.0 - 600.0)
    assert r.lost_gpu_s == (stop - 600.0) + 60.0 == r.lost_if_ignored_gpu_s
    assert r.wait_s == 0.0  # it restarted at once


def test_every_attempt_is_reported_as_it_ends():
    # Job 1 is stopped at 1000 s (the cycle that does it starts nothing) and leaves 30 s later;
    # in the next cycle job 2 starts for its 10 s and job 1 restarts, to end at 1030 + 60 + 2000
    # (the work left after the save on the notice).
    jobs = [job(1, 0, 3000.0), job(2, 1000.0, 10.0)]
    seen = []
    simulate(workload(jobs, gpus=8), Scripted(1, 1000.0), SimParams(restart_overhead_s=60.0),
             on_attempt=lambda jid, start, end: seen.append((jid, start, end)))
    assert seen == [(1, 0.0, 1030.0), (2, 1030.0, 1040.0), (1, 1030.0, 1030.0 + 60.0 + 2000.0)]


def test_preemption_honoured_by_a_checkpoint_on_notice_loses_only_the_save_and_the_restart():
    # The same, for a class that checkpoints on the notice (the default): it saves its 1000 s
    # of progress during the 30 s stop delay and redoes nothing.
    jobs = [job(1, 0, 3000.0), job(2, 1000.0, 10.0)]
    res = simulate(workload(jobs, gpus=8), Scripted(1, 1000.0), SimParams(restart_overhead_s=60.0))
    r = next(r for r in res.jobs if r.id == 1)
    stop = 1000.0 + 30.0
    assert r.end == stop + 60.0 + (3000.0 - 1000.0)
    assert r.lost_gpu_s == 30.0 + 60.0
    assert r.lost_if_ignored_gpu_s == (stop - 600.0) + 60.0  # what ignoring it would have cost
    m = metrics(res)
    assert m["lost_gpu_hours"] == round(90.0 / 3600, 2) and m["lost_gpu_hours_if_ignored"] == round(490.0 / 3600, 2)


def test_a_grace_too_short_for_the_save_loses_work_since_the_last_checkpoint():
    jobs = [job(1, 0, 3000.0), job(2, 1000.0, 10.0)]
    wl = workload(jobs, gpus=8)
    wl.classes = {"training": replace(CLASSES["training"], grace_s=10.0)}
    res = simulate(wl, Scripted(1, 1000.0), SimParams(restart_overhead_s=60.0))
    r = next(r for r in res.jobs if r.id == 1)
    assert r.lost_gpu_s == (1010.0 - 600.0) + 60.0


def test_a_notice_during_the_restart_load_saves_nothing_new():
    # Preempted at 1000 s (30 s save), restarted at 1030 s (60 s load to 1090 s), preempted again
    # at 1060 s, still loading: nothing of the second attempt is progress, all of its 60 s (load
    # and save) is lost; the third attempt loads for 60 s.
    class Twice(Scripted):
        def cycle(self, snap):
            res = super().cycle(snap)
            if self.done and snap.now >= 1060.0 and not getattr(self, "again", False):
                for r in snap.running:
                    if r.req.id == 1 and not r.preempting:
                        self.again = True
                        return CycleResult(preemptions=[Preempt(1, "test", 0)])
            return res

    jobs = [job(1, 0, 3000.0), job(2, 1000.0, 10.0), job(3, 1060.0, 10.0)]
    res = simulate(workload(jobs, gpus=8), Twice(1, 1000.0), SimParams(restart_overhead_s=60.0))
    r = next(r for r in res.jobs if r.id == 1)
    assert r.preemptions == 2
    assert r.lost_gpu_s == 30.0 + (1090.0 - 1030.0) + 60.0
    assert r.end == 1090.0 + 60.0 + (3000.0 - 1000.0)


def test_node_failure_requeues_its_jobs():
    wl = workload([job(1, 0, 50_000.0)], nodes=2)
    res = simulate(wl, Scripted(), SimParams(node_mtbf_s=5_000.0, node_repair_s=100.0, seed=3))
    r = res.jobs[0]
    assert r.failures >= 1 and r.end is not None and r.end > 50_000.0


def test_a_job_that_can_never_start_is_left_unfinished():
    class Never:
        name = "never"

        def cycle(self, snap):
            return CycleResult()

    res = simulate(workload([job(1, 0, 10.0)]), Never())
    assert metrics(res)["completed"] == 0 and metrics(res)["jobs"] == 1


def test_quota_violation_is_an_owed_team_kept_waiting_too_long():
    teams = {"a": Team("a", "c", {"default": Quota(2)}), "b": Team("b", "c", {"default": Quota(2)})}
    # b fills the node by borrowing; a's job then waits: Scripted never reclaims.
    jobs = [job(200 + i, 0, 10_000.0, team="b") for i in range(4)] + [job(101, 100, 10.0, team="a")]
    res = simulate(workload(jobs, teams=teams), Scripted())
    assert res.quota_violations == 1
    # Owed: a's 2 nominal GPUs, held by b from a's submission (100 s) until b's jobs end (10,000 s).
    assert res.quota_violation_gpu_s == pytest.approx(2 * (10_000.0 - 100.0), rel=0.01)
    assert metrics(res)["quota_owed_gpu_hours"] == pytest.approx(2 * 9_900 / 3600, abs=0.02)
    # The engine reclaims after its patience window: no violation.
    res = simulate(workload(jobs, teams=teams), TrainyardPolicy())
    assert res.quota_violations == 0
    assert metrics(res)["preemptions"] == 1


def test_same_workload_same_result():
    jobs = [job(i, i * 37.0, 500.0 + 91 * i, gpus=1 + i % 3) for i in range(40)]
    a = metrics(simulate(workload(jobs, nodes=2), TrainyardPolicy()))
    b = metrics(simulate(workload(jobs, nodes=2), TrainyardPolicy()))
    a.pop("sim_wall_s"), b.pop("sim_wall_s")
    assert a == b
