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
import yaml
from fastapi.testclient import TestClient
from markupsafe import escape

from tests.plane import TWO_TEAMS, Plane
from tests.sim.recorded_day import DAY_ORIGIN_AGO_S, THREE_TEAMS, half_quota, recorded_day, write_day
from trainyard.store.models import AttemptRow, JobRow

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
    tiny = [(g, f) for g, f, d, shown in re.findall(
        r'<tr data-group="([^"]*)" data-figure="([^"]*_share)"[^>]*data-delta="([^"]*)">.*?<td>([^<]*)</td></tr>', html, re.S)
        if 0 < abs(float(d)) < 0.0005 and shown == "0"]
    assert tiny, "a change smaller than the figure shows reads 0, not -0.000"
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


def test_odd_forms_are_answered_with_a_4xx_and_an_empty_window_with_zeros(plane: Plane) -> None:
    c = browser(plane, plane.admin_token)
    text = in_force(plane)["text"]
    for data, status, field in (({"text": text + "\x00"}, 400, "text"), ({"text": text, "since": "x" * 101}, 400, "since"),
                                ({"text": ""}, 400, None), ({}, 400, None)):
        r = c.post("/ui/config/what-if", data=data)
        assert r.status_code == status, (data.keys(), r.text)
        if field:
            assert f'data-field="{field}"' in r.text
    r = c.post("/ui/config/what-if", content=b"text=" + b"a" * 3_100_000,
               headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 413
    status, html = what_if(c, text, "now-1hours")  # no job in the window: a table of zeros, no error
    assert status == 200 and '<span id="what-if-jobs">0</span>' in html and 'id="what-if-error"' not in html


def test_the_pilot_pool_and_its_trial_are_shown_read_only_with_the_apis_figures(tmp_path) -> None:
    d = yaml.safe_load(TWO_TEAMS.read_text())
    d["pilot"] = {"nodes": "node-0"}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    p = Plane(tmp_path / "yard", config=path, start=False)
    try:
        c = browser(p, p.admin_token)
        assert '<span id="pilot-nodes">node-0</span>' in c.get("/ui/config").text
        assert 'id="no-trial"' in c.get("/ui/config").text
        d = yaml.safe_load(p.admin.get("/api/v1/cluster/config").json()["text"])
        d["health"] = {"checks": [{"name": "ecc", "command": ["true"], "timeout": "5s"}]}
        r = p.admin.post("/api/v1/cluster/pilot", json={"text": yaml.safe_dump(d), "message": f"try ecc {EVIL}"})
        assert r.status_code == 200, r.text
        now = time.time() + 1
        with p.cp.store.session() as s:  # an attempt that failed on the pilot's node since the trial began
            s.add(JobRow(id=1, name="j", user="alice", team="vision", job_class="batch", pool="default",
                         state="FAILED", command=["false"], workdir="/tmp", gpus=1, submit_time=now - 10,
                         queued_since=now - 10, start_time=now - 5, end_time=now, exit_code=1))
            s.flush()
            s.add(AttemptRow(job_id=1, attempt=0, placement=[{"node": "node-0", "gpus": [0]}], started_at=now - 5,
                             ended_at=now, state="FAILED", cause="failed", gpus=1, exit_code=1))
            s.commit()
        api = p.admin.get("/api/v1/cluster/pilot/status").json()
        html = c.get("/ui/config").text
        assert 'id="trial"' in html and EVIL not in html and "try ecc &lt;script&gt;" in html
        assert api["sides"]["pilot"]["attempts_failed"] == 1 and api["sides"]["rest"]["attempts_ended"] == 0
        for side in ("pilot", "rest"):
            s = api["sides"][side]
            row = re.search(rf'<tr data-side="{side}">(.*?)</tr>', html, re.S).group(1)
            tds = re.findall(r"<td>([^<]*)</td>", row)
            assert tds[:3] == [str(len(s["nodes"])), str(s["attempts_ended"]), str(s["attempts_failed"])]
        assert "yard cluster pilot" in html and 'action="/api/v1/cluster/pilot' not in html  # read-only
    finally:
        p.cp.stop()
