"""POST /api/v1/cluster/config/what-if and GET /api/v1/cluster/trace on a real plane (store, API,
no loop) holding a recorded day of three teams (`tests/sim/recorded_day.py`)."""

from __future__ import annotations

import time
from typing import Iterator

import pytest

from tests.plane import Plane
from tests.sim.recorded_day import DAY_ORIGIN_AGO_S, THREE_TEAMS, half_quota, recorded_day, write_day

pytestmark = pytest.mark.xdist_group("whatif-api")  # one plane for the module


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    p = Plane(tmp_path_factory.mktemp("whatif") / "yard", config=THREE_TEAMS, start=False)
    with p.cp.store.session() as s:
        write_day(s, recorded_day(), time.time() - DAY_ORIGIN_AGO_S)
        s.commit()
    yield p
    p.cp.stop()


def half_quota_text(p: Plane) -> str:
    return half_quota(p.admin.get("/api/v1/cluster/config").json()["text"])


def versions(p: Plane) -> list[dict]:
    return p.admin.get("/api/v1/cluster/config/versions").json()["versions"]


def test_halving_a_quota_shows_its_waits_rising_and_the_others_falling(plane: Plane) -> None:
    before = versions(plane)
    r = plane.admin.post("/api/v1/cluster/config/what-if", json={"text": half_quota_text(plane), "since": "now-3days"})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["jobs"] == 100 and doc["version"] == before[0]["version"]
    a, b = doc["in_force"]["teams"], doc["proposed"]["teams"]
    assert b["team-a"]["p99_wait_s"] > a["team-a"]["p99_wait_s"]
    for team in ("team-b", "team-c"):
        assert b[team]["p99_wait_s"] < a[team]["p99_wait_s"], team
        assert doc["delta"]["teams"][team]["p99_wait_s"] < 0
    assert (b["team-a"]["quota_share"], a["team-a"]["quota_share"]) == (0.25, 0.5)
    assert set(doc["in_force"]["classes"]) == {"interactive", "training", "batch"}
    assert versions(plane) == before  # nothing stored


def test_an_invalid_proposal_gets_the_errors_of_apply_and_nothing_is_stored(plane: Plane) -> None:
    before = versions(plane)
    bad = half_quota_text(plane).replace("priority: 100", "priority: lots")
    applied = plane.admin.post("/api/v1/cluster/config", json={"text": bad})
    what_if = plane.admin.post("/api/v1/cluster/config/what-if", json={"text": bad})
    assert applied.status_code == what_if.status_code == 400
    assert what_if.json() == applied.json() and "priority" in what_if.text
    assert versions(plane) == before


def test_only_an_admin_may_ask_and_a_bad_time_is_named(plane: Plane) -> None:
    member = plane.as_user("alice", "member", "team-a")
    assert member.post("/api/v1/cluster/config/what-if", json={"text": half_quota_text(plane)}).status_code == 403
    assert member.get("/api/v1/cluster/trace").status_code == 403
    r = plane.admin.post("/api/v1/cluster/config/what-if", json={"text": half_quota_text(plane), "since": "last tuesday"})
    assert r.status_code == 400 and r.json()["field"] == "since"
    empty = plane.admin.post("/api/v1/cluster/config/what-if", json={"text": half_quota_text(plane), "since": "now-1hours"})
    assert empty.status_code == 200 and empty.json()["jobs"] == 0  # no history: every figure 0, no error
    r = plane.admin.get("/api/v1/cluster/trace", params={"since": "now-1hours", "until": "now-2days"})
    assert r.status_code == 400 and r.json()["field"] == "until"


def test_the_trace_holds_each_job_that_ran_with_its_useful_run_time(plane: Plane) -> None:
    doc = plane.admin.get("/api/v1/cluster/trace", params={"since": "now-3days"}).json()
    assert doc["jobs"] == len(doc["records"]) == 100
    day = {rj.req.id: rj for rj in recorded_day()}
    for rec in doc["records"]:
        rj = day[rec["id"]]
        held = sum((e - s) * g for s, e, g, _ in rj.attempts)
        assert rec["run_time_s"] == pytest.approx((held - rj.lost_gpu_s) / rj.req.gpus)
        assert rec["run_time_s"] == pytest.approx(rj.run_s, abs=1e-3)  # the day's own true run time back
        assert rec["attempts"] == len(rj.attempts) and rec["preemptions"] == len(rj.attempts) - 1
        assert rec["time_limit_s"] == rj.req.est_runtime_s and rec["state"] == "COMPLETED"
    assert plane.admin.get("/api/v1/cluster/trace", params={"since": "now-1hours"}).json()["jobs"] == 0


