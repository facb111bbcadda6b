"""Step 5f: borrowing within the cohort by preempting lower-priority borrowers (issue 35 point 1),
and what a job blocked by quota is told when no step can help it.

The issue's case: 2 nodes x 4 GPUs; team vision (nominal 4) fills them with two 4-GPU batch jobs
(priority 100), borrowing 4; team speech (nominal 2) submits a 4-GPU interactive job (priority
300), 2 beyond its nominal, within its borrowing limit. Before, it waited `Quota` with the batch
jobs' time limit as its estimate; with 2 GPUs (within nominal) it reclaimed at once.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard.sched.cluster import ClusterState, Node
from trainyard.sched.engine import EngineParams, TrainyardPolicy
from trainyard.sched.types import BORROWING_LIMIT, COHORT_IN_USE, JobClass, JobRequest, Quota, Reason, Team
from trainyard.sim.simulator import SimParams, simulate
from trainyard.sim.workload import SimJob, Workload

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


# -- the property, in the simulator (a fake clock, the engine every cycle) -----------------------

def _workload(n_nodes: int, per_node: int, vision_nominal: int, speech_nominal: int, speech_limit: int | None,
              batch_min_run: float, batch_grace: float, stream: list[tuple[float, int]], ask_at: float,
              ask_gpus: int) -> Workload:
    """Team vision's stream of preemptible batch jobs (submit, GPUs), hours long, borrowing what
    audio (the rest of the cluster's quota) and speech lend; at `ask_at`, speech's job of a class
    of higher priority (`fast`, max wait 15 minutes), beyond its nominal quota."""
    classes = {"batch": JobClass("batch", 100, preemptible=True, max_wait_s=86400, min_run_s=batch_min_run,
                                 grace_s=batch_grace),
               "fast": JobClass("fast", 300, preemptible=True, max_wait_s=900, min_run_s=0, grace_s=30)}
    total = n_nodes * per_node
    tm = {"vision": Team("vision", "lab", {"default": Quota(vision_nominal)}),
          "speech": Team("speech", "lab", {"default": Quota(speech_nominal, borrowing_limit=speech_limit)}),
          "audio": Team("audio", "lab", {"default": Quota(total - vision_nominal - speech_nominal)})}
    jobs = [SimJob(JobRequest(100 + k, "vision", "batch", t, gpus=g, est_runtime_s=6 * 3600.0), 6 * 3600.0)
            for k, (t, g) in enumerate(stream)]
    jobs.append(SimJob(JobRequest(ASK, "speech", "fast", ask_at, gpus=ask_gpus, est_runtime_s=600.0), 600.0))
    jobs.sort(key=lambda j: (j.req.submit_time, j.req.id))
    return Workload([Node(f"n{i}", per_node, 80 * 1024) for i in range(n_nodes)], tm, classes, jobs)


@st.composite
def borrowing_cases(draw):
    """A cohort whose lower-priority borrower (vision) holds the GPUs; speech asks for more than
    its nominal quota, within its borrowing limit, and less than vision borrows (`v + g + 1 <=
    total`: freeing `g` GPUs on one node takes at most `g + 1` of vision's 1-2-GPU jobs, all
    borrowed, so victims exist that leave vision at or above its nominal quota)."""
    n_nodes, per_node = draw(st.integers(2, 4)), draw(st.sampled_from([4, 8]))
    total = n_nodes * per_node
    ask = draw(st.integers(2, per_node))
    speech = draw(st.integers(0, ask - 1))
    vision = draw(st.integers(0, total - ask - 1))
    vision = min(vision, total - speech)
    limit = draw(st.one_of(st.none(), st.integers(ask - speech, total)))
    # At least `total` GPUs asked for in the first minutes, each for 6 hours: vision holds all it
    # may (the whole cluster, or all but a hole a 2-GPU job does not fit) when speech asks.
    n = draw(st.integers(total, 2 * total))
    stream = sorted((draw(st.floats(0, 500)), draw(st.integers(1, 2))) for _ in range(n))
    return dict(n_nodes=n_nodes, per_node=per_node, vision_nominal=vision, speech_nominal=speech,
                speech_limit=limit, batch_min_run=draw(st.sampled_from([0.0, 300.0, 1200.0])),
                batch_grace=draw(st.sampled_from([0.0, 60.0, 300.0])), stream=stream,
                ask_at=draw(st.floats(600, 4 * 3600)), ask_gpus=ask)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(borrowing_cases())
def test_property_a_borrower_of_a_preempting_class_waits_at_most_max_wait_grace_and_min_run(case):
    """A job within its team's borrowing limit, of a class that preempts, waits at most its max
    wait + the victims' grace + their min run time while lower-priority borrowers hold what it
    needs. (It waits less: the step acts at once; a cycle and the sim's stop delay on top.)"""
    wl = _workload(**case)
    res = simulate(wl, ENGINE)
    job = next(r for r in res.jobs if r.id == ASK)
    batch = wl.classes["batch"]
    bound = wl.classes["fast"].max_wait_s + batch.grace_s + batch.min_run_s
    assert job.first_start is not None
    waited = job.first_start - case["ask_at"]
    assert waited <= bound, (waited, bound)
    assert waited <= batch.min_run_s + batch.grace_s + 2 * SimParams().tick_s, waited


def test_without_the_step_it_waits_for_the_batch_jobs_to_end():
    """The property's case with step 5f off: hours (the batch jobs' run time), not minutes."""
    case = dict(n_nodes=2, per_node=4, vision_nominal=4, speech_nominal=2, speech_limit=None, batch_min_run=300.0,
                batch_grace=60.0, stream=[(0.0, 2)] * 4 + [(100.0 * k, 1) for k in range(8)], ask_at=1800.0,
                ask_gpus=4)
    off = TrainyardPolicy(EngineParams(share_below_gpu_s=None, borrow_within_cohort=False))
    waited_off = next(r for r in simulate(_workload(**case), off).jobs if r.id == ASK).first_start - 1800.0
    waited_on = next(r for r in simulate(_workload(**case), ENGINE).jobs if r.id == ASK).first_start - 1800.0
    assert waited_off > 3 * 3600 and waited_on <= 300.0 + 60.0 + 60.0, (waited_off, waited_on)
