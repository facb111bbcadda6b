"""/api/v1/reservations (services/reservations.py): admin-only changes, a 4xx naming the field for
bad input with nothing stored, and submissions into a reservation checked."""

from __future__ import annotations

import time

import pytest

from tests.plane import Plane


@pytest.fixture(scope="module")
def p(tmp_path_factory):
    plane = Plane(tmp_path_factory.mktemp("resv-api"), start=False)
    yield plane
    plane.stop()


def _versions(p: Plane) -> int:
    return len(p.admin.get("/api/v1/cluster/config/versions").json()["versions"])


@pytest.mark.parametrize("body, status, field", [
    ({"nodes": "node-[0-99999999]"}, 400, "nodes"),
    ({"nodes": "node-[0"}, 400, "nodes"),
    ({"nodes": "node-9"}, 400, "nodes"),
    ({"start": "soon"}, 400, "start"),
    ({"start": 1e12}, 400, "start"),
    ({"duration": 0}, 400, "duration"),
    ({"duration": -60}, 400, "duration"),
    ({"duration": "1y"}, 400, "duration"),
    ({"duration": 1e12}, 400, None),
    ({"teams": ["speech"]}, 400, "teams"),
    ({"teams": [], "users": ["nobody"]}, 400, "users"),
    ({"name": "bad name!"}, 400, None),
])
def test_bad_input_is_a_4xx_and_nothing_is_stored(p, body, status, field):
    before = _versions(p)
    r = p.admin.post("/api/v1/reservations", json={"nodes": "node-0", "start": time.time(), "duration": 3600,
                                                   "teams": ["nlp"], **body})
    assert r.status_code == status, r.text
    if field:
        assert r.json().get("field") == field, r.text
    assert _versions(p) == before and p.admin.get("/api/v1/reservations").json()["reservations"] == []


def test_admin_only_and_submissions_checked(p):
    member = p.as_user("carol", "member", "nlp")
    other = p.as_user("victor", "member", "vision")
    body = {"name": "r1", "nodes": "node-1", "start": time.time(), "duration": "1h", "teams": ["nlp"]}
    assert member.post("/api/v1/reservations", json=body).status_code == 403
    r = p.admin.post("/api/v1/reservations", json=body)
    assert r.status_code == 201 and r.json()["state"] == "active", r.text
    assert p.admin.post("/api/v1/reservations", json=body).status_code == 409
    job = {"command": ["true"], "workdir": str(p.cp.data_dir), "reservation": "r1"}
    r = other.post("/api/v1/jobs", json=job)
    assert r.status_code == 403 and "not for user 'victor'" in r.text
    r = member.post("/api/v1/jobs", json={**job, "reservation": "r2"})
    assert r.status_code == 400 and r.json()["field"] == "reservation"
    r = member.post("/api/v1/jobs", json=job)
    assert r.status_code == 201 and r.json()["reservation"] == "r1", r.text
    assert member.delete("/api/v1/reservations/r1").status_code == 403
    assert p.admin.delete("/api/v1/reservations/r1").status_code == 200
    assert p.admin.delete("/api/v1/reservations/r1").status_code == 404
