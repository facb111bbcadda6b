"""`yard report`'s figures (services/usage_report.py) on SQLite and PostgreSQL, through the API: they
equal the accounting's records of the same window, quotas and busy-ness come out as arithmetic
says, borrowed and lent GPU-hours balance within a cohort, waits per class, who sees which users,
and bad periods."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.helpers import store_snapshot
from tests.services.acct_history import NOW, T0, H, Try, add_job
from trainyard.services.usage_report import nearest_rank

WINDOW = {"start": f"@{T0 + H}", "end": f"@{T0 + 3 * H}"}


def rep(client: Any, **params: Any) -> dict[str, Any]:
    r = client.get("/api/v1/report", params={**WINDOW, **params})
    assert r.status_code == 200, r.text
    return r.json()


def team(r: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in r["teams"] if t["team"] == name)


def test_the_report_equals_the_accounting_of_the_same_window(hist):
    r = rep(hist.p.admin)
    jobs = hist.p.admin.get("/api/v1/acct/jobs", params={"starttime": WINDOW["start"], "endtime": WINDOW["end"],
                                                         "truncate": "true"}).json()["jobs"]
    for name in ("vision", "nlp"):
        mine = [j for j in jobs if j["team"] == name]
        t = team(r, name)
        assert t["gpu_hours"] == pytest.approx(sum(j["gpu_hours"] for j in mine))
        assert t["lost_gpu_hours"] == pytest.approx(sum(j["lost_gpu_hours"] for j in mine))
        assert t["useful_gpu_hours"] == pytest.approx(sum(j["useful_gpu_hours"] for j in mine))
        users = [u for u in r["users"] if u["team"] == name]
        assert sum(u["gpu_hours"] for u in users) == pytest.approx(t["gpu_hours"])
    assert r["cluster"]["gpu_hours"] == pytest.approx(sum(j["gpu_hours"] for j in jobs))
    assert r["pools"][0]["gpu_hours"] == pytest.approx(r["cluster"]["gpu_hours"])


def test_figures_as_arithmetic_says(hist):
    r = rep(hist.p.admin)
    c = r["cluster"]
    # vision: 2 GPUs 1h..1.5h + 2 GPUs 2h..2.5h; nlp: 1 GPU 2h..2.25h + 3 GPUs 2.5h..3h
    assert c["gpu_hours"] == pytest.approx(2.0 + 1.75) and c["capacity_gpu_hours"] == pytest.approx(16.0)
    assert c["busy_pct"] == pytest.approx(100 * 3.75 / 16)
    assert c["lost_by_cause"] == {"preempted": pytest.approx(0.2), "oom": pytest.approx(0.2)}
    assert c["jobs_by_state"] == {"COMPLETED": 1, "OUT_OF_MEMORY": 1} and c["oom_rate"] == 0.5
    assert c["attempts_ended"] == 3 and c["preemptions_suffered"] == 1
    v, n = team(r, "vision"), team(r, "nlp")
    assert (v["nominal_gpus"], v["nominal_gpu_hours"], v["cohort"]) == (4, pytest.approx(8.0), "lab")
    assert v["quota_used_pct"] == pytest.approx(100 * 2.0 / 8.0) and v["share_of_pool_pct"] == pytest.approx(12.5)
    assert n["oom_rate"] == 1.0 and n["lost_by_cause"] == {"oom": pytest.approx(0.2)}
    assert v["borrowed_gpu_hours"] == v["lent_gpu_hours"] == n["borrowed_gpu_hours"] == 0
    (training,) = r["waits"]  # attempts started in the window: waits 0.5h, 0.1h, 0.1h
    assert training["class"] == "training" and training["attempts"] == 3
    assert training["p50_s"] == pytest.approx(0.1 * H) and training["p99_s"] == pytest.approx(0.5 * H)
    assert training["mean_s"] == pytest.approx(0.7 * H / 3) and training["max_s"] == pytest.approx(0.5 * H)


def test_a_wait_counts_from_the_previous_attempts_end_when_that_ended_before_the_period(hist):
    # The preempted job's first attempt ended at 1.5h, its second started at 2h: from 1.75h on,
    # the period holds only the second, whose wait is still 0.5h (not 2h since the submission).
    r = rep(hist.p.admin, start=f"@{T0 + 1.75 * H}")
    (training,) = r["waits"]
    assert training["attempts"] == 3 and training["max_s"] == pytest.approx(0.5 * H)
    assert training["mean_s"] == pytest.approx(0.7 * H / 3)


def test_borrowed_and_lent_balance_within_the_cohort(acct_plane):
    p = acct_plane
    # vision holds 6 GPUs (nominal 4) from 1h to 2h while nlp holds 1: vision borrows 2, nlp lends 2
    add_job(p, tries=(Try(H, 2 * H, gpus=4, node="node-0"),))
    add_job(p, tries=(Try(H, 2 * H, gpus=2, node="node-1"),))
    add_job(p, team="nlp", user="bob", tries=(Try(1.5 * H, 2.5 * H, gpus=1, node="node-1"),))
    r = rep(p.admin)
    v, n = team(r, "vision"), team(r, "nlp")
    assert v["borrowed_gpu_hours"] == pytest.approx(2.0) and v["lent_gpu_hours"] == 0
    assert n["lent_gpu_hours"] == pytest.approx(2.0) and n["borrowed_gpu_hours"] == 0
    assert v["quota_used_pct"] == pytest.approx(100 * 6.0 / 8.0)


def test_preemptions_caused_count_the_engines_requests_for_the_teams_jobs(acct_plane):
    p = acct_plane
    victim = add_job(p, tries=(Try(H, 1.5 * H, cause="preempted", state="PREEMPTED"),), state="REQUEUED")
    urgent = add_job(p, team="nlp", user="bob", tries=(Try(1.6 * H, 2 * H),))
    from trainyard.services.events import record

    with p.cp.store.session.begin() as s:
        record(s, "scheduler", "job.preempting", "preempted", job_id=victim, at=T0 + 1.4 * H,
               data={"reason": "reclaim", "for_job": urgent})
    r = rep(p.admin)
    assert team(r, "nlp")["preemptions_caused"] == 1 and team(r, "vision")["preemptions_suffered"] == 1
    assert team(r, "vision")["preemptions_caused"] == 0


def test_who_sees_which_users(hist):
    p = hist.p
    admin = rep(p.admin)
    assert admin["users_shown"] == "all" and {u["user"] for u in admin["users"]} == {"alice", "bob"}
    assert rep(p.as_user("olga", "operator"))["users_shown"] == "all"
    member = rep(p.as_user("bob", "member", "nlp"))
    assert member["users_shown"] == "nlp" and [u["user"] for u in member["users"]] == ["bob"]
    assert {t["team"] for t in member["teams"]} == {"vision", "nlp"}  # every team's totals
    viewer = rep(p.as_user("vic", "viewer"))
    assert viewer["users_shown"] == "none" and viewer["users"] == []
    assert viewer["cluster"]["gpu_hours"] == pytest.approx(admin["cluster"]["gpu_hours"])
    assert viewer["teams"] == admin["teams"]


def test_the_default_period_is_yesterday_and_a_start_alone_runs_to_now(acct_plane):
    r = rep(acct_plane.admin, start=None, end=None)
    assert r["end"] - r["start"] in (23 * H, 24 * H, 25 * H) and r["end"] <= NOW
    r = rep(acct_plane.admin, start=f"@{NOW - H}", end=None)
    assert r["end"] == NOW


@pytest.mark.parametrize("params,field", [
    ({"start": "soon"}, "start"), ({"end": "2026-02-30"}, "end"),
    ({"start": f"@{NOW}", "end": f"@{NOW - 60}"}, "end"),
])
def test_a_bad_period_is_a_400_naming_it_and_changes_nothing(acct_plane, params, field):
    before = store_snapshot(acct_plane)
    r = acct_plane.admin.get("/api/v1/report", params=params)
    assert r.status_code == 400 and r.json()["field"] == field, r.text
    assert store_snapshot(acct_plane) == before


def test_nearest_rank():
    assert [nearest_rank([1, 2, 3, 4], q) for q in (50, 90, 99)] == [2, 4, 4]
    assert nearest_rank([7], 50) == 7
