"""The simulator's start-time estimates (`SimParams.start_estimator`, sim/estimates.py): they change
no decision, every job that waited is judged on its first estimate, the learned run times are the
median of the key's completed jobs capped at the limit, and on a loaded synthetic workload the
learned estimator's p50 error is smaller than the limit's."""

from __future__ import annotations

import pytest

from trainyard.sched.engine import TrainyardPolicy
from trainyard.sched.types import JobRequest
from trainyard.services.estimates_report import LATE_AFTER_S as PLANE_LATE_AFTER_S
from trainyard.sim.estimates import LearnedRuntimes, apply_estimates
from trainyard.sim.result import LATE_AFTER_S, estimate_errors
from trainyard.sim.result import metrics
from trainyard.sim.simulator import SimParams, simulate
from trainyard.sim.synthetic import generate


@pytest.fixture(scope="module")
def runs():
    wl = generate(jobs=300, cluster="4x8", seed=3)
    wl.jobs = apply_estimates(wl.jobs, "user", 1)
    return {e: simulate(wl, TrainyardPolicy(), SimParams(start_estimator=e)) for e in (None, "limit", "learned")}


def decisions(res):
    return [(r.id, r.first_start, r.end, r.wait_s, r.preemptions) for r in sorted(res.jobs, key=lambda r: r.id)]


def test_an_estimator_changes_no_decision(runs):
    assert decisions(runs["limit"]) == decisions(runs[None]) == decisions(runs["learned"])
    assert all(r.first_est is None for r in runs[None].jobs)
    assert "est_p50_abs_err_s" not in metrics(runs[None])


def test_the_jobs_that_waited_are_judged_on_their_first_estimate(runs):
    res = runs["limit"]
    waited = [r for r in res.jobs if r.measured and r.first_est is not None and r.first_start > r.submit]
    assert len(waited) > 30
    m = metrics(res)
    assert m["est_waited"] == len(waited)
    assert m == {**m, **estimate_errors(res.jobs)}
    late = sum(r.first_start - r.first_est > LATE_AFTER_S for r in waited) / len(waited)
    assert m["est_late_share"] == pytest.approx(late, abs=1e-4)
    assert all(r.first_est >= r.submit for r in waited)
    assert all(r.first_est is None for r in res.jobs if r.first_start == r.submit)  # started at once: no promise


def test_learned_estimates_are_better_on_p50(runs):
    lim, lrn = metrics(runs["limit"]), metrics(runs["learned"])
    assert lrn["est_waited"] == lim["est_waited"]
    assert lrn["est_p50_abs_err_s"] < lim["est_p50_abs_err_s"]


def test_the_learner_takes_the_median_of_the_last_runs_of_a_key_capped_at_the_limit():
    learn = LearnedRuntimes(last=3)
    req = JobRequest(1, "vc", "training", 0.0, gpus=2, est_runtime_s=3600.0)
    assert learn.expected(req) is None
    for run_s in (100.0, 5000.0, 200.0, 300.0):  # the first falls out of the last three
        learn.observe(req, run_s)
    assert learn.expected(req) == 300.0
    learn.observe(req, 9000.0)
    learn.observe(req, 9000.0)
    assert learn.expected(req) == 3600.0  # the median (9000) capped at the limit
    assert learn.expected(JobRequest(2, "vc", "training", 0.0, gpus=4, est_runtime_s=3600.0)) is None  # other size
    assert learn.expected(JobRequest(3, "other", "training", 0.0, gpus=2, est_runtime_s=3600.0)) is None


def test_late_means_the_same_in_the_simulator_and_the_plane():
    assert LATE_AFTER_S == PLANE_LATE_AFTER_S


def test_an_unknown_estimator_is_refused():
    with pytest.raises(ValueError, match="start estimator"):
        simulate(generate(jobs=5, cluster="1x8"), TrainyardPolicy(), SimParams(start_estimator="oracle"))


def test_yard_sim_reports_the_estimate_errors_and_refuses_an_unknown_estimator(tmp_path):
    import json

    from typer.testing import CliRunner

    from trainyard.cli.main import app

    out = tmp_path / "out"
    bad = CliRunner().invoke(app, ["sim", "--format", "synthetic", "--jobs", "40", "--cluster", "1x8",
                                   "--policies", "trainyard", "--start-estimator", "oracle", "--out", str(out)])
    assert bad.exit_code == 2 and "--start-estimator" in bad.stderr and not out.exists()
    ok = CliRunner().invoke(app, ["sim", "--format", "synthetic", "--jobs", "40", "--cluster", "1x8",
                                  "--policies", "trainyard", "--start-estimator", "learned", "--out", str(out)])
    assert ok.exit_code == 0, ok.stderr
    rep = json.loads((out / "report.json").read_text())
    assert "est_p50_abs_err_s" in json.dumps(rep) and "est_p50_abs_err_s" in (out / "report.md").read_text()
