"""The dashboard's routes over HTTP, without a browser: the login and its cookie, redirects, roles
(the same answers as the API's), escaping, security headers, and bad input answered with a page
and a 4xx, never a 5xx. The plane runs without its loop: what a test sets up stays put.
"""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient
from markupsafe import escape
from sqlalchemy import update

from tests.plane import Plane, job_dir, script
from trainyard.api.app import create_app
from trainyard.services import auth
from trainyard.services.auth import SYSTEM
from trainyard.store.models import JobRow, NodeRow, TokenRow


@pytest.fixture
def plane(tmp_path):
    p = Plane(tmp_path / "yard", start=False)
    yield p
    p.cp.stop()


def browser(p: Plane, token: str | None = None) -> TestClient:
    """A client with no Authorization header, logged in through the form when given a token."""
    c = TestClient(p.app)
    if token is not None:
        r = c.post("/ui/login", data={"token": token}, follow_redirects=False)
        assert r.status_code == 303, r.text
    return c


def test_login_sets_an_httponly_strict_cookie_and_logout_clears_it(plane):
    c = TestClient(plane.app)
    r = c.get("/", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (307, "/ui/")
    r = c.get("/ui/", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/ui/login")
    r = c.get("/ui/jobs/7?rank=1", follow_redirects=False)
    assert r.headers["location"] == "/ui/login?next=%2Fui%2Fjobs%2F7%3Frank%3D1"
    r = c.post("/ui/login", data={"token": plane.admin_token, "next": "/ui/jobs/7?rank=1"}, follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/ui/jobs/7?rank=1")
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"yard_session={plane.admin_token};")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie and "Secure" not in cookie
    assert c.get("/ui/").status_code == 200
    r = c.post("/ui/logout", follow_redirects=False)
    assert r.headers["location"] == "/ui/login" and 'yard_session=""' in r.headers["set-cookie"]
    assert c.get("/ui/", follow_redirects=False).status_code == 303
    behind_tls = TestClient(plane.app).post("/ui/login", data={"token": plane.admin_token},
                                            headers={"X-Forwarded-Proto": "https"}, follow_redirects=False)
    assert "Secure" in behind_tls.headers["set-cookie"]


@pytest.mark.parametrize("token,status,message", [
    ("", 400, "paste a token"), ("ty_nope", 401, "unknown or revoked token"),
    ("x" * 5000, 401, "unknown or revoked token")])
def test_a_bad_token_shows_the_form_again_with_the_reason(plane, token, status, message):
    r = TestClient(plane.app).post("/ui/login", data={"token": token}, follow_redirects=False)
    assert r.status_code == status and "set-cookie" not in r.headers
    assert re.search(r'<p class="error" id="error" role="alert">([^<]*)</p>', r.text).group(1).startswith(message)


def test_job_tokens_do_not_log_in_and_revoked_tokens_are_logged_out(plane):
    with plane.cp.store.session.begin() as s:
        job_token = auth.create_token(s, user="job-1", role="job", team="vision", by=SYSTEM, job_id=1)
    r = TestClient(plane.app).post("/ui/login", data={"token": job_token}, follow_redirects=False)
    assert r.status_code == 403 and "a job token belongs to its job" in r.text
    # a job token sent as a header (scripts) gets the API's answer for cluster-wide reads
    r = TestClient(plane.app).get("/ui/", headers={"Authorization": f"Bearer {job_token}"})
    assert r.status_code == 403 and "a job token reads only its own job" in r.text
    token = plane.token("vic", "viewer")
    c = browser(plane, token)
    assert c.get("/ui/").status_code == 200
    with plane.cp.store.session.begin() as s:
        s.execute(update(TokenRow).where(TokenRow.token_hash == auth.hash_token(token)).values(revoked=True))
    auth.forget_cached_tokens()
    r = c.get("/ui/", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"


@pytest.mark.parametrize("target", ["//evil.example/ui/", "https://evil.example/", "/api/v1/jobs", "/ui/\\evil",
                                    "/ui/\r\nSet-Cookie: x=1"])
def test_login_never_redirects_off_the_dashboard(plane, target):
    r = TestClient(plane.app).post("/ui/login", data={"token": plane.admin_token, "next": target},
                                   follow_redirects=False)
    assert r.headers["location"] == "/ui/"


def test_a_form_posted_from_another_site_is_refused(plane):
    c = TestClient(plane.app)
    r = c.post("/ui/login", data={"token": plane.admin_token}, headers={"Origin": "https://evil.example"},
               follow_redirects=False)
    assert r.status_code == 403 and "set-cookie" not in r.headers
    r = c.post("/ui/login", data={"token": plane.admin_token}, headers={"Origin": "http://testserver"},
               follow_redirects=False)
    assert r.status_code == 303


def test_pages_carry_a_strict_content_security_policy(plane):
    c = browser(plane, plane.admin_token)
    for path in ("/ui/", "/ui/login", "/ui/jobs/12345"):
        r = c.get(path)
        assert "script-src 'self'" in r.headers["content-security-policy"], path
        assert r.headers["x-content-type-options"] == "nosniff" and r.headers["cache-control"] == "no-store"
    assert c.get("/ui/static/dashboard.js").headers["content-type"].startswith("text/javascript")
    assert c.get("/ui/static/../app.py").status_code == 404
    assert c.get("/ui/static/nothing.css").status_code == 404


def test_user_input_is_escaped_everywhere(plane):
    evil = "<script>alert(1)</script>\"'&"
    jid = plane.submit(command=script("pass"), team="vision", name=evil, env={"X": evil})["id"]
    with plane.cp.store.session.begin() as s:
        s.execute(update(JobRow).where(JobRow.id == jid).values(reason=evil))
        s.add(NodeRow(name="node-1", state="down", reason=evil))
    c = browser(plane, plane.admin_token)
    for page in (c.get("/ui/").text, c.get(f"/ui/jobs/{jid}").text):
        assert "<script>alert" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;&#34;&#39;&amp;" in page


@pytest.mark.parametrize("path,status", [
    ("/ui/jobs/abc", 404), ("/ui/jobs/0", 404), ("/ui/jobs/99999999999999999999", 404), ("/ui/jobs/-1", 404),
    ("/ui/jobs/%00", 404), ("/ui/jobs/%C2%B2", 404), ("/ui/jobs/1?rank=%C2%B2", 400), ("/ui/?refresh=%C2%B2", 400), ("/ui/jobs/424242", 404), ("/ui/jobs/1?rank=x", 400), ("/ui/jobs/1?rank=-1", 400),
    ("/ui/jobs/1?rank=99999999999999", 400), ("/ui/?window=forever", 400), ("/ui/?window=%00", 400),
    ("/ui/?refresh=-1", 400), ("/ui/?refresh=1e9", 400), ("/ui/?refresh=99999", 400),
])
def test_bad_input_gets_a_page_and_a_4xx(plane, path, status):
    plane.submit(command=script("pass"), team="vision")
    r = browser(plane, plane.admin_token).get(path)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("text/html") and 'id="error"' in r.text


def test_roles_as_in_the_api(plane):
    jid = plane.submit(command=script("pass"), team="vision", name="v")["id"]
    logs = job_dir(plane.cp.data_dir, jid) / "logs"
    logs.mkdir(parents=True)
    (logs / "rank-0.log").write_text("secret training output\n")
    for who, role, team, reads_logs in (("vic", "viewer", None, False), ("nora", "member", "nlp", False),
                                        ("vera", "member", "vision", True), ("otto", "operator", None, True)):
        token = plane.token(who, role, team)
        page = browser(plane, token)
        assert page.get("/ui/").status_code == 200, who  # everyone reads the map and the queue
        r = page.get(f"/ui/jobs/{jid}")
        assert r.status_code == 200
        api = plane.client(token).get(f"/api/v1/jobs/{jid}/logs")
        assert (api.status_code == 200) is reads_logs, who
        assert ("secret training output" in r.text) is reads_logs, who
        if not reads_logs:
            assert escape(api.json()["detail"]) in r.text  # the API's own refusal, word for word


def test_node_health_states_are_on_the_map(plane):
    with plane.cp.store.session.begin() as s:
        s.add(NodeRow(name="node-0", state="remediating", reason="remediation 1/3: reboot"))
        s.add(NodeRow(name="node-1", state="down", reason="ecc: uncorrectable (health)"))
    page = browser(plane, plane.token("vic", "viewer")).get("/ui/").text
    assert 'data-node="node-0" data-state="remediating"' in page and "remediation 1/3: reboot" in page
    assert 'data-node="node-1" data-state="down"' in page and "ecc: uncorrectable (health)" in page
    assert '<span class="state remediating">1 remediating</span>' in page


def test_bearer_header_works_for_scripts_and_ui_stays_out_of_the_openapi_schema(plane):
    r = TestClient(plane.app).get("/ui/", headers={"Authorization": f"Bearer {plane.admin_token}"})
    assert r.status_code == 200 and 'id="cluster-map"' in r.text
    paths = create_app(None).openapi()["paths"]  # type: ignore[arg-type]
    assert not [p for p in paths if p.startswith("/ui") or p == "/"]


def test_no_query_or_path_text_makes_a_5xx(plane):
    """Whatever text lands in the job id, rank, window, refresh or next: a page, never a 5xx."""
    from urllib.parse import quote

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tests.hypothesis_setup import examples

    plane.submit(command=script("pass"), team="vision")
    c = browser(plane, plane.admin_token)
    text = st.text(st.characters(codec="utf-8"), max_size=30)

    @settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
    @given(job=text, rank=text, window=text, refresh=text, nxt=text)
    def check(job: str, rank: str, window: str, refresh: str, nxt: str) -> None:
        for r in (c.get(f"/ui/jobs/{quote(job, safe='')}", params={"rank": rank}),
                  c.get("/ui/", params={"window": window, "refresh": refresh}),
                  c.get("/ui/login", params={"next": nxt}),
                  TestClient(plane.app).post("/ui/login", data={"token": job, "next": nxt}, follow_redirects=False)):
            assert r.status_code < 500, (r.request.url, r.text[:300])

    check()


def test_a_job_waiting_on_a_dependency_says_so(plane):
    gate = plane.cp.data_dir / "gate"
    first = plane.submit(command=script(f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)"),
                         team="vision")["id"]
    then = plane.submit(command=script("pass"), team="vision", dependency=f"afterok:{first}")["id"]
    c = browser(plane, plane.admin_token)
    page = c.get(f"/ui/jobs/{then}").text
    assert f'<td colspan="5" class="dependency">afterok:{first}</td>' in page and "Dependency" in page
    assert 'class="dependency"' not in c.get(f"/ui/jobs/{first}").text  # no row when there is none
    gate.touch()


def test_an_array_task_names_its_array(plane):
    aid = plane.submit(command=script("pass"), team="vision", array="4-5", hold=True)["id"]
    second = plane.admin.get("/api/v1/jobs", params={"array": aid}).json()["jobs"][1]["id"]
    page = browser(plane, plane.admin_token).get(f"/ui/jobs/{second}").text
    assert f'task 5 of job array <a href="/ui/jobs/{aid}">{aid}</a> ({aid}_5)' in page
