"""Recorded start estimates (services/estimates.py) and learned run times (services/learned_runtimes.py)
on a real SQLite store: a spell keeps its first estimate and the latest ones, a start settles the
first estimate's error, a requeued job's next wait is a promise of its own, retention deletes the
rows with the job while the Prometheus samples stay, and the run time learned is the median of the
user's past runs of the same name, capped at the limit."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import func, select

from tests.plane import TWO_TEAMS, Plane
from tests.services.acct_history import NOW, T0, H, Try, add_job
from tests.services.test_retention import carried_samples
from trainyard.services import estimates, learned_runtimes
from trainyard.services.accounting import Window
from trainyard.services.estimates_report import report
from trainyard.store.models import EstimateOutcomeRow, JobRow, StartEstimateRow


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(TWO_TEAMS.read_text() + "retention: {jobs: 1h}\n")
    p = Plane(tmp_path / "yard", config=cfg, start=False)
    p.cp.clock = p.cp.retention.clock = lambda: NOW
    yield p
    p.cp.stop()


def rows(p: Plane, jid: int) -> list[tuple[int, float, float]]:
    with p.cp.store.session() as s:
        return [tuple(r) for r in s.execute(select(StartEstimateRow.attempt, StartEstimateRow.at,
                                                   StartEstimateRow.est_start)
                                            .where(StartEstimateRow.job_id == jid).order_by(StartEstimateRow.id))]


def test_only_changes_are_worth_a_row():
    assert estimates.changed(None, 5.0) and estimates.changed(5.0, 65.0) and estimates.changed(65.0, 4.0)
    assert not estimates.changed(5.0, 64.5) and not estimates.changed(5.0, None) and not estimates.changed(None, None)


def test_a_spell_keeps_its_first_estimate_and_the_latest(plane):
    jid = add_job(plane, state="PENDING", submit=0.0)
    n = estimates.KEPT + 10
    for i in range(n):
        with plane.cp.store.session.begin() as s:
            estimates.record(s, [(jid, 1, T0 + H + i)], T0 + i)
    kept = rows(plane, jid)
    assert len(kept) == estimates.KEPT
    assert kept[0] == (1, T0, T0 + H)  # the first: what the user was told
    assert [r[1] for r in kept[1:]] == [T0 + i for i in range(n - estimates.KEPT + 1, n)]  # the latest


def test_an_estimate_drifting_each_pass_is_recorded_once_it_moved_from_the_last_row(plane):
    jid = add_job(plane, state="PENDING", submit=0.0)
    rec = estimates.Recorder()
    stored = None
    for i in range(41):  # told "in a minute" at each pass, 3 s apart
        est = T0 + 60 + 3 * i
        with plane.cp.store.session.begin() as s:
            rec.note(s, T0 + 3 * i, {jid: est, 999: None}, {jid: (1, stored)})
        stored = est  # the column the schedule step overwrites every pass
    assert [r[2] - T0 for r in rows(plane, jid)] == pytest.approx([60.0, 120.0, 180.0])
    # a restarted plane (a new recorder) compares with the stored column: nothing new for 0.3 s
    with plane.cp.store.session.begin() as s:
        assert estimates.Recorder().note(s, T0 + 3, {jid: stored + 0.3}, {jid: (1, stored)}) == 0
        # the next wait (after a requeue) is recorded from its first estimate
        assert rec.note(s, T0 + 4, {jid: stored}, {jid: (2, None)}) == 1
    assert rows(plane, jid)[-1][0] == 2


def test_a_start_settles_the_first_and_last_estimates(plane):
    jid = add_job(plane, state="PENDING", submit=0.0)
    with plane.cp.store.session.begin() as s:
        estimates.record(s, [(jid, 1, T0 + 2 * H)], T0 + 10)
        estimates.record(s, [(jid, 1, T0 + 1.5 * H)], T0 + 0.5 * H)
    with plane.cp.store.session.begin() as s:
        j = s.get(JobRow, jid)
        o = estimates.settle(s, j, T0 + 1.6 * H)
    assert o is not None
    with plane.cp.store.session() as s:
        o = s.get(EstimateOutcomeRow, (jid, 1))
        assert (o.first_at, o.first_estimate, o.last_estimate, o.changes) == (T0 + 10, T0 + 2 * H, T0 + 1.5 * H, 2)
        assert o.error_s == pytest.approx(-0.4 * H) and o.last_error_s == pytest.approx(0.1 * H)
        assert (o.team, o.job_class, o.user) == ("vision", "training", "alice")
        # its next wait (after a requeue: attempt 2) has no estimate yet: a start then settles nothing
        j = s.get(JobRow, jid)
        j.attempt = 1
        assert estimates.settle(s, j, T0 + 3 * H) is None
    rep = report(plane.cp.store.session(), Window(T0, NOW))
    assert [(r.key, r.starts, r.late_share) for r in rep.rows] == [("training", 1, 0.0), ("(all)", 1, 0.0)]
    assert rep.rows[0].p50_abs_error_s == pytest.approx(0.4 * H)
    assert report(plane.cp.store.session(), Window(T0, T0 + H)).rows == []


def test_retention_deletes_the_rows_with_the_job_and_the_samples_stay(plane):
    old = add_job(plane, name="old", submit=0.0, tries=(Try(0.5 * H, 1.0 * H),))
    new = add_job(plane, name="new", submit=0.0, tries=(Try(3.5 * H, 3.9 * H),))
    with plane.cp.store.session.begin() as s:
        for jid, at in ((old, 0.2 * H), (new, 3.0 * H)):
            j = s.get(JobRow, jid)
            j.attempt = 0
            estimates.record(s, [(jid, 1, T0 + at + 600)], T0 + at)
            estimates.settle(s, j, T0 + at + 7200)  # two hours late: late
            j.attempt = 1
    before = carried_samples(plane)
    assert before[("trainyard_start_estimate_error_seconds_count", (("class", "training"),))] == 2
    assert before[("trainyard_start_estimate_late_total", (("class", "training"),))] == 2
    assert plane.cp.retention.run_once() == 1
    with plane.cp.store.session() as s:
        for model in (StartEstimateRow, EstimateOutcomeRow):
            assert set(s.scalars(select(model.job_id))) == {new}
            assert s.scalar(select(func.count()).select_from(model)) == 1
    assert carried_samples(plane) == pytest.approx(before)


def test_the_learned_run_time_is_the_median_of_the_users_past_runs_capped_at_the_limit(plane):
    for i, run_h in enumerate((1.0, 2.0, 3.0, 10.0)):
        add_job(plane, name="train", submit=i, tries=(Try(i, i + run_h * H),))
    add_job(plane, name="train", user="bob", submit=0.0, tries=(Try(0, 0.1 * H),))  # another user's
    add_job(plane, name="train", submit=0.0, state="FAILED", tries=(Try(0, 0.1 * H, state="FAILED", cause="crash"),))
    add_job(plane, name="train", submit=0.0, tries=(Try(0, 0.1 * H, state="REQUEUED", cause="preempted"),
                                                    Try(H, 1.1 * H)))  # two attempts: not a whole run
    with plane.cp.store.session() as s:
        assert learned_runtimes.expected(s, "alice", "train", None) == pytest.approx(2.5 * H)
        assert learned_runtimes.expected(s, "alice", "train", 2 * H) == pytest.approx(2 * H)
        assert learned_runtimes.expected(s, "alice", "other", 2 * H) is None
        assert learned_runtimes.expected(s, "bob", "train", None) == pytest.approx(0.1 * H)
