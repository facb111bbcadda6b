"""The dashboard's configuration page (/ui/config) over HTTP, on a real plane (store, API, no loop)
holding a recorded day of three teams (`tests/sim/recorded_day.py`): the configuration in force,
its versions and a diff, the pilot pool, and the what-if form (admins only) with the API's own
figures and errors, everything user-written escaped.
"""

from __future__ import annotations

import re
import time
from typing import Iterator

import pytest
from fastapi.testclient import TestClient

from tests.plane import Plane
from tests.sim.recorded_day import DAY_ORIGIN_AGO_S, THREE_TEAMS, half_quota, recorded_day, write_day

pytestmark = pytest.mark.xdist_group("dashboard-config")  # one plane for the module

EVIL = '<script>window.pwned=1</script>'


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    p = Plane(tmp_path_factory.mktemp("dashconfig") / "yard", config=THREE_TEAMS, start=False)
    with p.cp.store.session() as s:
        write_day(s, recorded_day(), time.time() - DAY_ORIGIN_AGO_S)
        s.commit()
    yield p
    p.cp.stop()


def browser(p: Plane, token: str) -> TestClient:
    """A client logged in through the form (the session cookie, no Authorization header)."""
    c = TestClient(p.app)
    r = c.post("/ui/login", data={"token": token}, follow_redirects=False)
    assert r.status_code == 303, r.text
    return c


def in_force(p: Plane) -> dict:
    return p.admin.get("/api/v1/cluster/config").json()


def versions(p: Plane) -> list[dict]:
    return p.admin.get("/api/v1/cluster/config/versions").json()["versions"]


def what_if(c: TestClient, text: str, since: str = "now-3days") -> tuple[int, str]:
    r = c.post("/ui/config/what-if", data={"text": text, "since": since})
    return r.status_code, r.text


def cells(html: str, group: str, figure: str) -> dict[str, float]:
    """The what-if table's row for (group, figure): its data-* numbers."""
    m = re.search(rf'<tr data-group="{re.escape(group)}" data-figure="{figure}" data-in-force="([^"]*)" '
                  r'data-proposed="([^"]*)"\s+data-delta="([^"]*)"', html)
    assert m, f"no row {group} {figure}"
    return dict(zip(("in_force", "proposed", "delta"), map(float, m.groups())))


def test_the_page_shows_the_configuration_in_force_its_versions_and_a_diff(plane: Plane) -> None:
    cur = in_force(plane)
    new = cur["text"].replace("priority: 100", "priority: 110")
    r = plane.admin.post("/api/v1/cluster/config", json={"text": new, "message": "batch up a little"})
    assert r.status_code == 200, r.text
    page = browser(plane, plane.admin_token).get("/ui/config")
    assert page.status_code == 200 and 'href="/ui/config"' in page.text  # the nav link
    html = page.text
    top = versions(plane)[0]["version"]
    assert f'<section id="in-force" data-version="{top}">' in html and "batch up a little" in html
    assert "priority: 110" in html  # the YAML in force
    assert all(f'<tr data-version="{v["version"]}">' in html for v in versions(plane))
    diff = browser(plane, plane.admin_token).get("/ui/config", params={"diff": str(cur["version"])}).text
    api = plane.admin.get("/api/v1/cluster/config/diff", params={"from": cur["version"], "to": top}).json()["diff"]
    assert '<span class="del">-  - {name: batch, priority: 100' in diff
    assert '<span class="add">+  - {name: batch, priority: 110' in diff
    assert diff.count('<span class="add">') == sum(1 for x in api.splitlines() if x.startswith("+") and not x.startswith("+++"))
    for bad, status in (("999", 404), ("x1", 404), ("0", 404)):
        assert browser(plane, plane.admin_token).get("/ui/config", params={"diff": bad}).status_code == status
    assert '<p class="muted" id="no-pilot">' in html


def test_a_viewer_sees_the_page_without_the_form_and_may_not_post(plane: Plane) -> None:
    viewer = browser(plane, plane.token("vic", "viewer"))
    html = viewer.get("/ui/config").text
    assert 'id="what-if-admins"' in html and 'id="what-if-form"' not in html and 'id="history"' in html
    status, text = what_if(viewer, half_quota(in_force(plane)["text"]))
    assert status == 403 and "only an admin" in text
    member = browser(plane, plane.token("alice", "member", "team-a"))
    assert what_if(member, "not: [valid")[0] == 403  # refused before the text is read
    assert TestClient(plane.app).get("/ui/config", follow_redirects=False).status_code == 303  # no session: log in


def test_the_what_if_renders_the_apis_figures_per_team_and_class(plane: Plane) -> None:
    before = versions(plane)
    text = half_quota(in_force(plane)["text"])
    api = plane.admin.post("/api/v1/cluster/config/what-if", json={"text": text, "since": "now-3days"}).json()
    status, html = what_if(browser(plane, plane.admin_token), text.replace("\n", "\r\n"))  # a textarea's line ends
    assert status == 200, html
    assert '<span id="what-if-jobs">100</span>' in html
    a = cells(html, "team team-a", "p99_wait_s")
    assert a["proposed"] > a["in_force"] and a["delta"] > 0
    assert a == {"in_force": api["in_force"]["teams"]["team-a"]["p99_wait_s"],
                 "proposed": api["proposed"]["teams"]["team-a"]["p99_wait_s"],
                 "delta": api["delta"]["teams"]["team-a"]["p99_wait_s"]}
    for team in ("team-b", "team-c"):
        assert cells(html, f"team {team}", "p99_wait_s")["delta"] < 0
    assert cells(html, "team team-a", "quota_share") == {"in_force": 0.5, "proposed": 0.25, "delta": -0.25}
    assert cells(html, "class batch", "mean_wait_s")["in_force"] == api["in_force"]["classes"]["batch"]["mean_wait_s"]
    assert cells(html, "all jobs", "utilization")["proposed"] == api["proposed"]["metrics"]["utilization"]
    assert "{nominal: 4}" in html  # the form keeps the proposal
    assert versions(plane) == before  # nothing applied


@pytest.mark.parametrize("edit,since,field", [
    (lambda t: t.replace("priority: 300", "priority: lots"), "now-3days", "classes"),
    (lambda t: t, "last tuesday", "since"),
    (lambda t: "teams: [", "", None),
])
def test_a_bad_proposal_gets_the_apis_error_on_the_page_and_nothing_is_stored(plane: Plane, edit, since, field) -> None:
    before = versions(plane)
    text = edit(in_force(plane)["text"])
    api = plane.admin.post("/api/v1/cluster/config/what-if", json={"text": text, "since": since or None})
    status, html = what_if(browser(plane, plane.admin_token), text, since)
    assert status == api.status_code and status in (400, 422)
    m = re.search(r'<p class="error" id="what-if-error" role="alert" data-field="([^"]*)">([^<]*)</p>', html)
    assert m, html
    from markupsafe import escape
    assert m.group(2) == str(escape(api.json()["detail"])) and m.group(1) == (api.json()["field"] or "")
    if field is not None:
        assert field in m.group(1)
    assert 'id="what-if-table"' not in html and 'id="what-if-form"' in html
    assert versions(plane) == before


def test_user_text_is_escaped_everywhere(plane: Plane) -> None:
    cur = in_force(plane)["text"]
    r = plane.admin.post("/api/v1/cluster/config", json={"text": cur + f"# {EVIL}\n", "message": f"tidy {EVIL}"})
    assert r.status_code == 200, r.text
    c = browser(plane, plane.admin_token)
    page = c.get("/ui/config", params={"diff": "1"})
    assert EVIL not in page.text and "&lt;script&gt;window.pwned=1&lt;/script&gt;" in page.text
    assert page.text.count("&lt;script&gt;") >= 4  # the message twice, the YAML, the diff, the form
    assert "script-src 'self'" in page.headers["content-security-policy"]
    status, html = what_if(c, f"teams: [{EVIL}", "")
    assert status == 400 and EVIL not in html
    r = c.post("/ui/config/what-if", data={"text": "x"}, headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and "another site" in r.text
