"""`yard acct`'s records (services/accounting.py) on SQLite and PostgreSQL, through the real API:
which jobs a window holds, GPU-hours whole and truncated, lost and useful GPU-hours, waits, one
record per attempt, keyset pages, filters, who sees what, and bad input that changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.helpers import store_snapshot
from tests.services.acct_history import NOW, T0
from trainyard.services.accounting import attempt_waits

H = 3600.0


def page(client: Any, path: str = "/api/v1/acct/jobs", **params: Any) -> dict[str, Any]:
    r = client.get(path, params={"starttime": f"@{T0 + H}", "endtime": f"@{T0 + 3 * H}", **params})
    assert r.status_code == 200, r.text
    return r.json()


def by_id(records: list[dict]) -> dict[int, dict]:
    return {r["id"]: r for r in records}


def test_the_window_holds_the_jobs_that_were_in_the_system_during_it(hist):
    jobs = by_id(page(hist.p.admin)["jobs"])
    assert set(jobs) == {hist.preempted, hist.oom, hist.running, hist.pending}


def test_a_job_ending_at_the_window_start_is_in_it_and_one_submitted_after_its_end_is_not(hist):
    jobs = by_id(page(hist.p.admin, starttime=f"@{T0 + 0.9 * H}", endtime=f"@{T0 + 3.5 * H - 1}")["jobs"])
    assert hist.early in jobs and hist.late not in jobs
    assert hist.late in by_id(page(hist.p.admin, endtime=f"@{T0 + 3.5 * H}")["jobs"])


def test_gpu_hours_whole_and_truncated_lost_useful_and_waits(hist):
    whole = by_id(page(hist.p.admin)["jobs"])
    p = whole[hist.preempted]
    assert p["attempts"] == 2 and p["gpus"] == 2 and p["state"] == "COMPLETED" and p["cause"] == "completed"
    assert p["gpu_hours"] == pytest.approx(2 * 1.0 + 2 * 0.5)
    assert p["lost_gpu_hours"] == pytest.approx(0.2) and p["lost_by_cause"] == {"preempted": pytest.approx(0.2)}
    assert p["useful_gpu_hours"] == pytest.approx(3.0 - 0.2)
    assert p["elapsed_s"] == pytest.approx(1.5 * H)
    assert p["wait_s"] == pytest.approx(0.25 * H + 0.5 * H)  # eligible 0.25h → 0.5h, then 1.5h → 2h
    assert p["max_rss_mib"] == 512.0 and p["start"] == T0 + 0.5 * H and p["end"] == T0 + 2.5 * H
    assert whole[hist.running]["gpu_hours"] == pytest.approx(3 * 1.5) and whole[hist.running]["end"] is None
    assert whole[hist.pending]["wait_s"] == pytest.approx(3 * H)  # pending since it became eligible at 1h
    assert whole[hist.pending]["gpu_hours"] == 0 and whole[hist.pending]["start"] is None

    cut = by_id(page(hist.p.admin, truncate="true")["jobs"])
    p = cut[hist.preempted]
    assert p["gpu_hours"] == pytest.approx(2 * 0.5 + 2 * 0.5)  # 1h..1.5h and 2h..2.5h
    assert p["lost_gpu_hours"] == pytest.approx(0.2)  # the preemption at 1.5h is inside the window
    assert p["start"] == T0 + H  # truncated to the window, as sacct --truncate
    assert cut[hist.running]["gpu_hours"] == pytest.approx(3 * 0.5)
    assert cut[hist.oom]["gpu_hours"] == pytest.approx(0.25) and cut[hist.oom]["lost_by_cause"] == {
        "oom": pytest.approx(0.2)}


def test_one_record_per_attempt_adds_up_to_the_jobs(hist):
    for truncate in ("false", "true"):
        jobs = by_id(page(hist.p.admin, truncate=truncate)["jobs"])
        tries = page(hist.p.admin, "/api/v1/acct/attempts", truncate=truncate)["attempts"]
        assert sorted((a["job_id"], a["attempt"]) for a in tries) == [
            (hist.preempted, 1), (hist.preempted, 2), (hist.oom, 1), (hist.running, 1)]
        for jid in (hist.preempted, hist.oom, hist.running):
            mine = [a for a in tries if a["job_id"] == jid]
            for k in ("gpu_hours", "lost_gpu_hours", "useful_gpu_hours", "elapsed_s"):
                assert sum(a[k] for a in mine) == pytest.approx(jobs[jid][k]), (jid, k)
            assert sum(a["wait_s"] for a in mine) == pytest.approx(jobs[jid]["wait_s"])
    first, second = sorted((a for a in tries if a["job_id"] == hist.preempted), key=lambda a: a["attempt"])
    assert (first["cause"], first["state"], second["cause"]) == ("preempted", "PREEMPTED", "completed")
    assert first["class"] == "training" and first["nodelist"] == ["node-0"]


def test_attempt_waits_count_from_eligibility_then_from_the_previous_end():
    assert attempt_waits(0.0, 10.0, [(30.0, 50.0), (55.0, None)]) == [20.0, 5.0]
    assert attempt_waits(0.0, 99.0, [(30.0, 50.0)]) == [30.0]  # eligible after it started: a later release
    assert attempt_waits(0.0, None, [(30.0, 50.0)]) == [30.0]


def test_pages_follow_one_another_without_gaps_or_repeats(hist):
    whole = [j["id"] for j in page(hist.p.admin, starttime=f"@{T0}", endtime=f"@{NOW}")["jobs"]]
    seen, after = [], 0
    while True:
        pg = page(hist.p.admin, starttime=f"@{T0}", endtime=f"@{NOW}", limit=2, after=after)
        seen += [j["id"] for j in pg["jobs"]]
        if pg["next_after"] is None:
            break
        after = pg["next_after"]
    assert seen == whole and len(whole) == 6


@pytest.mark.parametrize("params,expect", [
    ({"user": "bob"}, {"oom", "running"}),
    ({"team": "nlp,vision"}, {"oom", "running", "preempted", "waiting"}),
    ({"state": "OOM,r"}, {"oom", "running"}),
    ({"class": "batch"}, {"waiting"}),
    ({"node": "node-1"}, {"oom", "running"}),
    ({"pool": "other"}, set()),
])
def test_filters(hist, params, expect):
    assert {j["name"] for j in page(hist.p.admin, **params)["jobs"]} == expect


def test_ids_filter(hist):
    assert [j["id"] for j in page(hist.p.admin, jobs=f"{hist.oom},{hist.running}")["jobs"]] == [hist.oom, hist.running]


def test_who_sees_what(hist):
    p = hist.p
    everyone = {hist.preempted, hist.oom, hist.running, hist.pending}
    assert set(by_id(page(p.as_user("olga", "operator"))["jobs"])) == everyone
    member = p.as_user("bob", "member", "nlp")
    assert set(by_id(page(member)["jobs"])) == {hist.oom, hist.running}  # their team's only
    r = member.get("/api/v1/acct/jobs", params={"team": "vision"})
    assert r.status_code == 403 and r.json()["field"] == "team"
    r = member.get("/api/v1/acct/attempts", params={"team": "vision"})
    assert r.status_code == 403
    assert {a["team"] for a in page(member, "/api/v1/acct/attempts")["attempts"]} == {"nlp"}
    viewer = p.as_user("vic", "viewer")
    r = viewer.get("/api/v1/acct/jobs")
    assert r.status_code == 403 and "totals" in r.json()["detail"]
    assert viewer.get("/api/v1/acct/attempts").status_code == 403
    assert p.client("").get("/api/v1/acct/jobs").status_code == 401


@pytest.mark.parametrize("params,field", [
    ({"starttime": "yesterday-ish"}, "starttime"),
    ({"endtime": "2026-13-01"}, "endtime"),
    ({"starttime": "now", "endtime": "now-1day"}, "endtime"),
    ({"state": "DONE"}, "state"),
    ({"jobs": "12,x"}, "jobs"),
])
def test_bad_input_is_a_400_naming_the_parameter_and_changes_nothing(hist, params, field):
    before = store_snapshot(hist.p)
    for path in ("/api/v1/acct/jobs", "/api/v1/acct/attempts"):
        r = hist.p.admin.get(path, params=params)
        assert r.status_code == 400, r.text
        assert r.json()["field"] == field and field in r.json()["detail"]
    assert store_snapshot(hist.p) == before


def test_the_openapi_spec_types_the_records(acct_plane):
    spec = acct_plane.http.get("/openapi.json").json()
    job = spec["components"]["schemas"]["AcctJob"]["properties"]
    assert job["gpu_hours"]["type"] == "number" and "class" in job and job["lost_by_cause"]["type"] == "object"
    ok = spec["paths"]["/api/v1/acct/jobs"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok["$ref"].endswith("/AcctJobPage")
