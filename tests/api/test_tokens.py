"""Taking tokens back through the API and the dashboard: list (never the secret), revoke by id or
by user, effective at the next request although the token was cached, recorded as events; job
tokens and the last admin token are protected. The plane runs without its loop."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from tests.plane import Plane
from trainyard.services import auth
from trainyard.store.models import EventRow, TokenRow


@pytest.fixture
def plane(tmp_path):
    p = Plane(tmp_path / "yard", start=False)
    yield p
    p.cp.stop()


def listed(p: Plane, **params: str) -> list[dict]:
    r = p.admin.get("/api/v1/tokens", params=params)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_list_shows_who_role_team_and_last_use_but_never_the_secret(plane):
    secret = plane.token("alice", "member", "vision")
    before = {t["user"]: t for t in listed(plane)}
    assert set(before) == {"admin", "alice"}
    alice = before["alice"]
    assert (alice["role"], alice["team"], alice["created_by"], alice["revoked"]) == ("member", "vision", "admin", False)
    assert alice["last_used_at"] is None and alice["created_at"] > 0
    assert plane.client(secret).get("/api/v1/whoami").status_code == 200
    assert listed(plane, user="alice")[0]["last_used_at"] >= alice["created_at"]
    body = plane.admin.get("/api/v1/tokens", params={"revoked": "true", "jobs": "true"}).text
    assert secret not in body and auth.hash_token(secret) not in body


def test_a_revoked_token_is_refused_at_the_next_request_though_cached(plane):
    secret = plane.token("alice", "member", "vision")
    alice = plane.client(secret)
    assert alice.get("/api/v1/jobs").status_code == 200
    assert auth.cached_principal(secret) is not None  # the next request would not touch the store
    tid = listed(plane, user="alice")[0]["id"]
    r = plane.admin.delete(f"/api/v1/tokens/{tid}")
    assert r.status_code == 200 and [t["id"] for t in r.json()["revoked"]] == [tid]
    r = alice.get("/api/v1/jobs")
    assert r.status_code == 401 and "revoked" in r.json()["detail"]
    assert listed(plane, user="alice") == []
    assert listed(plane, user="alice", revoked="true")[0]["revoked"] is True
    with plane.cp.store.session() as s:
        ev = s.scalars(select(EventRow).where(EventRow.kind == "token.revoked")).all()
    assert [(e.actor, e.data["user"], e.data["id"]) for e in ev] == [("admin", "alice", tid)]
    again = plane.admin.delete(f"/api/v1/tokens/{tid}")  # twice: nothing more to do, no new event
    assert again.status_code == 200 and again.json()["revoked"] == []


def test_revoke_by_user_takes_every_personal_token_and_spares_others(plane):
    a1, a2 = plane.token("alice", "member", "vision"), plane.token("alice", "viewer")
    bob = plane.token("bob", "member", "nlp")
    r = plane.admin.post("/api/v1/tokens/revoke", json={"user": "alice"})
    assert r.status_code == 200 and len(r.json()["revoked"]) == 2
    for t in (a1, a2):
        assert plane.client(t).get("/api/v1/whoami").status_code == 401
    assert plane.client(bob).get("/api/v1/whoami").status_code == 200


def test_the_dashboard_login_refuses_a_revoked_token_and_its_session_ends(plane):
    secret = plane.token("alice", "member", "vision")
    browser = TestClient(plane.app)
    assert browser.post("/ui/login", data={"token": secret}, follow_redirects=False).status_code == 303
    assert browser.get("/ui/", follow_redirects=False).status_code == 200
    plane.admin.post("/api/v1/tokens/revoke", json={"user": "alice"})
    r = browser.get("/ui/", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/ui/login")
    r = TestClient(plane.app).post("/ui/login", data={"token": secret}, follow_redirects=False)
    assert r.status_code == 401 and "revoked" in r.text


def test_only_an_admin_lists_others_tokens_or_revokes(plane):
    op = plane.as_user("olga", "operator")
    tid = listed(plane)[0]["id"]
    own = op.get("/api/v1/tokens", params={"jobs": "true"})  # one's own personal tokens only (yard token list)
    assert own.status_code == 200 and [t["user"] for t in own.json()["tokens"]] == ["olga"]
    assert op.get("/api/v1/tokens", params={"user": "admin"}).status_code == 403
    assert op.delete(f"/api/v1/tokens/{tid}").status_code == 403
    assert op.post("/api/v1/tokens/revoke", json={"user": "admin"}).status_code == 403
    assert plane.admin.get("/api/v1/whoami").status_code == 200


def test_bad_revocations_are_4xx_and_change_nothing(plane):
    only_admin = listed(plane, user="admin")[0]["id"]
    r = plane.admin.delete(f"/api/v1/tokens/{only_admin}")
    assert r.status_code == 409 and "last admin token" in r.json()["detail"]
    assert plane.admin.delete("/api/v1/tokens/999").status_code == 404
    assert plane.admin.delete("/api/v1/tokens/0").status_code == 422
    r = plane.admin.post("/api/v1/tokens/revoke", json={"user": "nobody"})
    assert r.status_code == 404 and r.json()["field"] == "user"
    with plane.cp.store.session.begin() as s:  # a job's token, as the loop makes one at a start
        job_token = auth.create_token(s, user="job-7", role="job", team="vision", by=auth.SYSTEM, job_id=7)
    jid = listed(plane, jobs="true", user="job-7")[0]["id"]
    r = plane.admin.delete(f"/api/v1/tokens/{jid}")
    assert r.status_code == 400 and "cancel the job" in r.json()["detail"]
    assert plane.client(job_token).get("/api/v1/whoami").status_code == 200
    assert plane.admin.get("/api/v1/whoami").status_code == 200  # the admin token still works
    with plane.cp.store.session() as s:
        assert not any(t.revoked for t in s.scalars(select(TokenRow)))


def test_a_second_admin_token_lets_the_first_be_revoked(plane):
    new_admin = plane.token("root-2", "admin")
    first = listed(plane, user="admin")[0]["id"]
    assert plane.client(new_admin).delete(f"/api/v1/tokens/{first}").status_code == 200
    assert plane.admin.get("/api/v1/whoami").status_code == 401
