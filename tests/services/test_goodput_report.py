"""The ledger added up (services/goodput_report.py), over a written history in a real store (SQLite, PostgreSQL):
a job's answer, the report's sections, a period's part of an attempt, a node's share, who sees what."""

from __future__ import annotations

import math

import pytest

from tests.plane import Plane
from tests.services.acct_history import T0, H, Try, add_job
from trainyard.contracts import LEDGER_BUCKETS
from trainyard.services import goodput_report, usage_report
from trainyard.services.accounting import Window
from trainyard.services.auth import Principal
from trainyard.services.errors import Forbidden, ServiceError
from trainyard.store.models import AttemptRow, GpuSampleRow

NOW = T0 + 4 * H
ADMIN = Principal(user="admin", role="admin")


def ledger(**kw: float) -> dict[str, float]:
    return {b: kw.get(b, 0.0) for b in LEDGER_BUCKETS}


@pytest.fixture
def plane(acct_plane: Plane) -> Plane:
    """A plane without its loop on SQLite and on PostgreSQL (tests/services/conftest.py): the ledgers
    are JSON columns that the report reads in SQL on both."""
    return acct_plane


@pytest.fixture
def jobs(plane: Plane) -> dict[str, int]:
    """vision: a 2-GPU job of two attempts (1 h each, ledgers stored); nlp: a 3-GPU job running
    since 3 h on two nodes (1 + 2 GPUs), idle by its telemetry for its last half hour."""
    two = add_job(plane, name="two", tries=(Try(0, H, cause="preempted", state="PREEMPTED", lost_gpu_s=600),
                                            Try(2 * H, 3 * H)))
    run = add_job(plane, name="run", team="nlp", user="bob", state="RUNNING", tries=(Try(3 * H, None, gpus=3),))
    with plane.cp.store.session.begin() as s:
        a1, a2 = s.query(AttemptRow).filter_by(job_id=two).order_by(AttemptRow.attempt).all()
        a1.ledger = ledger(startup=600, compute=5400, recompute=600, teardown=600)
        a2.ledger = ledger(startup=300, compute=6000, data_wait=600, idle=300)
        ar = s.query(AttemptRow).filter_by(job_id=run).one()
        ar.placement = [{"node": "node-0", "gpus": [0], "mem_mib": 0}, {"node": "node-1", "gpus": [0, 1], "mem_mib": 0}]
        ar.first_output_at = T0 + 3 * H + 60
        s.add_all(GpuSampleRow(job_id=run, attempt=1, node="n", gpu=g, time=T0 + 3.5 * H + k * 60, period_s=60,
                               util=1.0, util_peak=1.0, mem_mib=0.0) for g in range(3) for k in range(1, 31))
    return {"two": two, "run": run}


def total(b: dict[str, float]) -> float:
    return math.fsum(b.values())


def test_a_jobs_answer_has_each_attempt_and_their_sum(plane, jobs):
    with plane.cp.store.session() as s:
        g = goodput_report.job_goodput(s, plane.cp.data_dir, None, jobs["two"], ADMIN, NOW)
    assert [a.attempt for a in g.attempts] == [1, 2] and not any(a.live for a in g.attempts)
    assert g.allocated_gpu_s == pytest.approx(2 * 2 * H)
    assert g.buckets["recompute"] == 600 and g.buckets["compute"] == 11400
    with plane.cp.store.session() as s:
        r = goodput_report.job_goodput(s, plane.cp.data_dir, None, jobs["run"], ADMIN, NOW)
    (a,) = r.attempts
    assert a.live and a.allocated_gpu_s == pytest.approx(3 * H)
    assert a.buckets["startup"] == pytest.approx(3 * 60) and a.buckets["idle"] == pytest.approx(3 * 0.5 * H)


def test_the_report_adds_up_per_team_and_equals_the_sum_of_the_teams_jobs(plane, jobs):
    with plane.cp.store.session() as s:
        rep = goodput_report.report(s, None, ADMIN, Window(T0, NOW), NOW, data_dir=plane.cp.data_dir)
        by_job = {k: goodput_report.job_goodput(s, plane.cp.data_dir, None, j, ADMIN, NOW) for k, j in jobs.items()}
    teams = {r.key: r for r in rep.sections["team"]}
    for team, job in (("vision", "two"), ("nlp", "run")):
        for b in LEDGER_BUCKETS:
            assert teams[team].buckets[b] == pytest.approx(by_job[job].buckets[b])
    (cluster,) = rep.sections["cluster"]
    assert cluster.allocated_gpu_s == pytest.approx(4 * H + 3 * H)
    assert cluster.goodput == pytest.approx(cluster.buckets["compute"] / cluster.allocated_gpu_s)
    nodes = {r.key: r.allocated_gpu_s for r in rep.sections["node"]}
    assert nodes["node-1"] == pytest.approx(2 * H) and nodes["node-0"] == pytest.approx(4 * H + H)


def test_a_period_takes_the_part_of_each_attempt_inside_it(plane, jobs):
    with plane.cp.store.session() as s:
        rep = goodput_report.report(s, None, ADMIN, Window(T0 + 0.5 * H, T0 + 2.5 * H), NOW, ("team",))
    (vision,) = rep.sections["team"]
    assert vision.allocated_gpu_s == pytest.approx(2 * H)  # half of each attempt
    assert vision.buckets["recompute"] == pytest.approx(300) and vision.buckets["data_wait"] == pytest.approx(300)


def test_the_usage_reports_teams_and_users_carry_the_buckets(plane, jobs):
    with plane.cp.store.session() as s:
        rep = usage_report.report(s, plane.cp.configs.current(s), ADMIN, Window(T0, NOW), NOW)
    vision = next(t for t in rep.teams if t.team == "vision")
    assert vision.buckets is not None and math.fsum(vision.buckets.values()) == pytest.approx(vision.gpu_hours)
    bob = next(u for u in rep.users if u.user == "bob")
    assert bob.buckets is not None and bob.buckets["idle"] == pytest.approx(3 * 0.5)  # 3 GPUs idle for half an hour


def test_who_sees_which_rows(plane, jobs):
    with plane.cp.store.session() as s:
        member = goodput_report.report(s, None, Principal(user="ann", role="member", team="nlp"), Window(T0, NOW), NOW)
        viewer = goodput_report.report(s, None, Principal(user="v", role="viewer"), Window(T0, NOW), NOW)
        with pytest.raises(Forbidden):
            goodput_report.report(s, None, Principal(user="j", role="job", job_id=1), Window(T0, NOW), NOW)
    assert [r.key for r in member.sections["user"]] == ["nlp/bob"] and member.users_shown == "nlp"
    assert viewer.sections["user"] == [] and len(viewer.sections["team"]) == 2


def test_an_unknown_section_names_by():
    with pytest.raises(ServiceError) as e:
        goodput_report.sections_of("team,rack")
    assert e.value.field == "by"
    assert goodput_report.sections_of("") == goodput_report.SECTIONS


@pytest.mark.parametrize("window", [(T0, NOW), (T0 + 0.5 * H, T0 + 3.5 * H)])
def test_the_usage_reports_sums_equal_the_attempts_split_one_by_one(plane, jobs, window):
    """`yard report` adds the ended attempts up with numpy (usage_report._ledgers): a stored ledger,
    and one without (split from its row: startup to its first output, lost work recomputed, more
    lost work than compute); the goodput report splits each attempt on its own. They agree."""
    bare = add_job(plane, name="bare", team="nlp", user="carol", tries=(
        Try(0.25 * H, 1.25 * H, gpus=4, cause="crash", state="FAILED", lost_gpu_s=10 * H),
        Try(1.5 * H, 2.5 * H, gpus=1, lost_gpu_s=100.0)))
    with plane.cp.store.session.begin() as s:
        s.query(AttemptRow).filter_by(job_id=bare, attempt=2).one().first_output_at = T0 + 1.5 * H + 300
    win = Window(*window)
    with plane.cp.store.session() as s:
        usage = usage_report.report(s, plane.cp.configs.current(s), ADMIN, win, NOW)
        rep = goodput_report.report(s, None, ADMIN, win, NOW, ("team", "user"))
    by_user = {r.key: r.buckets for r in rep.sections["user"]}
    assert "nlp/carol" in by_user
    for u in usage.users:
        assert u.buckets is not None and by_user[f"{u.team}/{u.user}"] == pytest.approx(
            {b: v * 3600 for b, v in u.buckets.items()}, abs=1e-6), u.user
    by_team = {r.key: r.buckets for r in rep.sections["team"]}
    for t in usage.teams:
        assert {b: v * 3600 for b, v in (t.buckets or goodput_report.goodput.empty()).items()} == pytest.approx(
            by_team.get(t.team, goodput_report.goodput.empty()), abs=1e-6), t.team
