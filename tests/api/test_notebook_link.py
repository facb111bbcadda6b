"""A notebook's token stays its owner's (issue 38, `yard notebook`): the job view and the dashboard's
job page give the token and the "Open notebook" link to the job's owner and admins only; the rest of
the team (who read the job's env, command and logs), other teams, operators and viewers see that it
is a notebook, never its token or URL, and no listing shows them to anyone.

The plane runs without its loop (the held job stays put): this is about what is shown; the
real-process test (tests/cli/test_notebook.py) serves the notebook through the link.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.plane import Plane

TOKEN = "nb-token-" + "x" * 30
URL = f"http://127.0.0.1:40123/lab?token={TOKEN}"


@pytest.fixture(scope="module")
def plane(tmp_path_factory) -> Iterator[Plane]:
    p = Plane(tmp_path_factory.mktemp("nblink") / "yard", start=False)
    yield p
    p.cp.stop()


@pytest.fixture(scope="module")
def clients(plane: Plane) -> dict:
    return {name: plane.as_user(user, role, team) for name, (user, role, team) in {
        "owner": ("alice", "member", "vision"), "teammate": ("bob", "member", "vision"),
        "other-team": ("nora", "member", "nlp"), "operator": ("olga", "operator", None),
        "viewer": ("vic", "viewer", None)}.items()} | {"admin": plane.admin}


@pytest.fixture(scope="module")
def notebook(plane: Plane, clients: dict) -> int:
    return plane.submit(clients["owner"], team="vision", gpus=1, hold=True, script="#!/bin/sh\nsleep 100\n",
                        interactive={"kind": "notebook", "port": 23456, "token": TOKEN, "url": URL})["id"]


def test_the_owner_and_admins_see_the_token_and_url_the_others_only_that_it_is_a_notebook(clients, notebook):
    for who, c in clients.items():
        rec = c.get(f"/api/v1/jobs/{notebook}").json()["interactive"]
        if who in ("owner", "admin"):
            assert rec == {"kind": "notebook", "port": 23456, "token": TOKEN, "url": URL}, who
        else:
            assert rec == {"kind": "notebook", "port": 23456}, who


def test_no_listing_shows_the_token_not_even_to_its_owner(clients, notebook):
    for who, c in clients.items():
        for params in ({}, {"fields": "id,interactive"}):
            r = c.get("/api/v1/jobs", params=params)
            assert r.status_code == 200, r.text
            assert TOKEN not in r.text, (who, params)
            mine = [j for j in r.json()["jobs"] if j["id"] == notebook]
            assert mine and mine[0]["interactive"] == {"kind": "notebook", "port": 23456}, (who, params)


def test_the_events_of_the_job_carry_no_token(clients, notebook):
    r = clients["teammate"].get(f"/api/v1/jobs/{notebook}/events")
    assert r.status_code == 200 and TOKEN not in r.text


@pytest.mark.parametrize("ask, field", [
    ({"kind": "alloc", "token": TOKEN}, "token"),  # only a notebook has one
    ({"kind": "notebook", "token": "short"}, "token"),
    ({"kind": "notebook", "token": TOKEN + " x"}, "token"),
    ({"kind": "notebook", "port": 0}, "port"),
    ({"kind": "notebook", "url": "javascript:alert(1)"}, "url"),
    ({"kind": "notebook", "secret": 1}, "secret"),
])
def test_a_bad_notebook_record_is_refused_naming_its_field(plane, clients, ask, field):
    r = clients["owner"].post("/api/v1/jobs", json={"team": "vision", "gpus": 1, "hold": True,
                                                    "workdir": str(plane.cp.data_dir), "interactive": ask})
    assert r.status_code == 422, r.text
    assert field in r.text


def test_the_job_page_links_the_notebook_for_its_owner_only(plane, clients, notebook):
    with plane.cp.store.session.begin() as s:  # as if it ran: the link is shown while it runs
        from trainyard.store.models import JobRow

        s.get(JobRow, notebook).state = "RUNNING"
    try:
        for who, c in clients.items():
            html = c.get(f"/ui/jobs/{notebook}").text
            assert 'data-kind="notebook"' in html, who
            if who in ("owner", "admin"):
                assert f'id="open-notebook" href="{URL.replace("&", "&amp;")}"' in html, who
            else:
                assert "open-notebook" not in html and TOKEN not in html, who
    finally:
        with plane.cp.store.session.begin() as s:
            s.get(JobRow, notebook).state = "PENDING"
    html = clients["owner"].get(f"/ui/jobs/{notebook}").text
    assert "open-notebook" not in html  # a notebook that does not run has nothing to open
