"""Step 5f: borrowing within the cohort by preempting lower-priority borrowers (issue 35 point 1),
and what a job blocked by quota is told when no step can help it.

The issue's case: 2 nodes x 4 GPUs; team vision (nominal 4) fills them with two 4-GPU batch jobs
(priority 100), borrowing 4; team speech (nominal 2) submits a 4-GPU interactive job (priority
300), 2 beyond its nominal, within its borrowing limit. Before, it waited `Quota` with the batch
jobs' time limit as its estimate; with 2 GPUs (within nominal) it reclaimed at once.
"""

from __future__ import annotations

from dataclasses import replace

from trainyard.sched.cluster import ClusterState
from trainyard.sched.engine import EngineParams, TrainyardPolicy
from trainyard.sched.types import BORROWING_LIMIT, COHORT_IN_USE, JobClass, Quota, Reason, Team

from tests.sched.builders import CLASSES, nodes, pending, req, running, snapshot
from tests.sched.test_reclaim import after

ENGINE = TrainyardPolicy(EngineParams(share_below_gpu_s=None))  # the rule alone
NOW = 10_000.0
BATCH_LIMIT = 4 * 3600.0  # the batch class's time limit in this file (max run time)
ASK = 300  # speech's interactive job


def _classes(min_run_s: float = 0.0) -> dict[str, JobClass]:
    return {**CLASSES, "batch": replace(CLASSES["batch"], max_run_s=BATCH_LIMIT, min_run_s=min_run_s)}


def _teams(speech_limit: int | None = None, speech_cohort: str | None = "lab",
           vision_nominal: int = 4) -> dict[str, Team]:
    return {"vision": Team("vision", "lab", {"default": Quota(vision_nominal)}),
            "speech": Team("speech", speech_cohort, {"default": Quota(2, borrowing_limit=speech_limit)}),
            "audio": Team("audio", "lab", {"default": Quota(8 - vision_nominal - 2)})}


def _case(gpus: int = 4, cls: str = "interactive", vision_cls: str = "batch", started: float = 0.0,
          min_run_s: float = 0.0, gang: bool = False, **team_kw):
    ns = nodes(2, gpus=4, per_rack=2, per_block=1)
    state = ClusterState(ns)
    if gang:
        run = [running(state, req(100, "vision", vision_cls, gpus=8, gpus_per_node=4, min_nodes=2, max_nodes=2),
                       start=started)]
    else:
        run = [running(state, req(100 + k, "vision", vision_cls, gpus=4, gpus_per_node=4, min_nodes=1, max_nodes=1),
                       start=started) for k in range(2)]
    snap = snapshot(ns, _teams(**team_kw), run, [pending(req(ASK, "speech", cls, gpus=gpus, submit=NOW - 5))],
                    now=NOW)
    return replace(snap, classes=_classes(min_run_s))


def test_the_issues_case_preempts_one_batch_job_at_once():
    res = ENGINE.cycle(_case())
    assert [(p.job_id, p.reason, p.for_job) for p in res.preemptions] == [(100, "borrow", ASK)]
    info = res.pending[ASK]
    assert info.reason == Reason.PREEMPTING
    # It starts when its victim has left (the batch class's grace), not at the batch time limit.
    assert info.est_start == NOW + CLASSES["batch"].grace_s


def test_it_starts_on_its_victims_gpus_and_nothing_stops_it_back():
    snap = _case()
    res = ENGINE.cycle(snap)
    nxt = after(snap, res, NOW + 61)
    res2 = ENGINE.cycle(nxt)
    assert [s.job_id for s in res2.starts] == [ASK] and not res2.preemptions
    # The victim waits to borrow again (vision holds its nominal 4), and much later still does
    # not stop the interactive job: it is of lower priority and would have to borrow.
    later = after(nxt, res2, NOW + 7 * 86400)
    res3 = ENGINE.cycle(later)
    assert not res3.preemptions and res3.pending[100].reason == Reason.QUOTA


def test_off_it_waits_as_before():
    res = TrainyardPolicy(EngineParams(share_below_gpu_s=None, borrow_within_cohort=False)).cycle(_case())
    assert not res.preemptions and res.pending[ASK].reason == Reason.QUOTA


def test_within_nominal_it_is_step_5_as_before():
    res = ENGINE.cycle(_case(gpus=2))  # of higher priority, within its nominal: step 5 at once
    assert [(p.job_id, p.reason) for p in res.preemptions] == [(100, "priority")]


def test_never_a_job_of_its_priority_or_higher():
    res = ENGINE.cycle(_case(cls="batch"))  # a batch job does not stop batch jobs to borrow
    assert not res.preemptions
    # It waits for the batch jobs to end, and is told so: the estimate is their time limit.
    assert res.pending[ASK].detail == COHORT_IN_USE and res.pending[ASK].est_start == BATCH_LIMIT
    res = ENGINE.cycle(_case(vision_cls="interactive"))  # nor non-preemptible, higher work
    assert not res.preemptions and res.pending[ASK].detail == COHORT_IN_USE


def test_never_more_than_its_teams_borrowing_limit():
    res = ENGINE.cycle(_case(speech_limit=1))  # it needs 2 beyond its nominal
    assert not res.preemptions
    info = res.pending[ASK]
    assert info.reason == Reason.QUOTA and info.detail == BORROWING_LIMIT
    assert ENGINE.cycle(_case(speech_limit=2)).preemptions  # exactly the limit: it may


def test_a_team_without_a_cohort_never_borrows():
    res = ENGINE.cycle(_case(speech_cohort=None))
    assert not res.preemptions and res.pending[ASK].detail == BORROWING_LIMIT


def test_never_takes_a_team_below_its_nominal_quota():
    """Vision's one 8-GPU gang borrows 4: stopping it would take vision to 0 of its 4, for a job
    that borrows. Not done; the job is told the cohort's GPUs are held by work it may not stop."""
    res = ENGINE.cycle(_case(gang=True))
    assert not res.preemptions
    assert res.pending[ASK].detail == COHORT_IN_USE


def test_victims_within_their_min_run_time_are_waited_for_and_the_estimate_says_when():
    started = NOW - 100.0
    snap = _case(started=started, min_run_s=600.0)
    res = ENGINE.cycle(snap)
    assert not res.preemptions
    info = res.pending[ASK]
    # Not the batch time limit: when the first batch job is past its min run time, plus its grace.
    assert info.reason == Reason.QUOTA and info.detail is None
    assert info.est_start == started + 600.0 + CLASSES["batch"].grace_s
    assert info.est_start != started + BATCH_LIMIT
    later = ENGINE.cycle(replace(snap, now=started + 600.0))
    assert [p.reason for p in later.preemptions] == ["borrow"]


def test_a_team_that_borrows_less_than_a_job_keeps_it():
    """Vision's nominal is 5: it borrows 3, less than either 4-GPU batch job, so neither goes (it
    would end below its nominal quota), and the job is told why."""
    res = ENGINE.cycle(_case(vision_nominal=5))
    assert not res.preemptions
    assert res.pending[ASK].detail == COHORT_IN_USE
