"""Interactive allocations through the API (issue 38, services/allocations.py): the `interactive`
field at submit, the terminal's `session=1`, the session's end ending the allocation, and release.

A real uvicorn on loopback over the fake plane (tests/api/terminal_plane.py), real `websockets`
clients, real pseudo-terminals; the loop is stepped by hand on the fake clock. The hold script runs
as a fake rank that never ends (the fake backend runs no processes). The same on a real `yard up`
with the local backend: tests/cli/test_alloc_yard_up.py.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from websockets.asyncio.client import connect

from tests.api import terminal_plane
from tests.api.test_terminal import _refused, _session, _url
from trainyard.backends.fake import parse_program
from trainyard.services import allocations
from trainyard.spec.models import parse_config

pytestmark = pytest.mark.xdist_group("terminal-api")


@pytest.fixture(scope="module")
def t(tmp_path_factory):
    served, server, thread = terminal_plane.serve(tmp_path_factory.mktemp("alloc") / "d")
    served.p.backend.programs["/bin/bash"] = parse_program(["yard-fake"])[0]  # the hold: runs until stopped
    yield served
    terminal_plane.stop(served, server, thread)


def _alloc(t, **body) -> int:
    c = t.p.client(t.alice)
    j = t.p.submit(c, interactive={"kind": "alloc"}, gpus=1, team="vision", **body)
    return j["id"]


def _running_alloc(t, **body) -> int:
    jid = _alloc(t, **body)
    t.p.wait(jid, "RUNNING", timeout=60)
    return jid


def _ended(t, jid: int) -> dict:
    return t.p.wait(jid, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=60)


# -- submit ---------------------------------------------------------------------------------------


def test_an_allocation_gets_the_hold_the_interactive_class_and_shows_its_kind(t) -> None:
    jid = _alloc(t)
    j = t.p.client(t.alice).get(f"/api/v1/jobs/{jid}").json()
    assert j["interactive"] == {"kind": "alloc"}
    assert (j["class"], j["name"], j["output"]) == ("interactive", "interactive", None)  # no slurm-%j.out
    assert j["command"] == []  # a batch job: the hold script
    t.p.admin.post(f"/api/v1/jobs/{jid}/cancel")


def test_a_batch_job_shows_no_interactive_record(t) -> None:
    assert t.p.job(t.running)["interactive"] is None


@pytest.mark.parametrize("ask, field", [({"kind": "vnc"}, ["body", "interactive", "kind"]),
                                         ({"kind": "alloc", "x": 1}, ["body", "interactive", "x"]),
                                         ({}, ["body", "interactive", "kind"])])
def test_a_bad_interactive_field_is_422_naming_it(t, ask: dict, field: list) -> None:
    r = t.p.client(t.alice).post("/api/v1/jobs", json={"interactive": ask, "gpus": 1, "team": "vision"})
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in r.json()["detail"]] == [field]


def test_the_class_is_the_configurations_when_configured_else_the_default() -> None:
    from tests.plane import TWO_TEAMS
    from trainyard.services.config import ConfigVersion

    text = TWO_TEAMS.read_text()
    ask = allocations.InteractiveAsk(kind="alloc")
    for extra, want in (("", "interactive"), ("interactive: {class: batch}\n", "batch"),
                        ("interactive: {class: nosuch}\n", "training")):
        cfg = ConfigVersion(1, parse_config(text + extra), text + extra, "t", 0.0, "")
        assert allocations.defaults(ask, "", [], None, None, cfg)["job_class"] == want
        assert allocations.defaults(ask, "", [], None, "batch", cfg).get("job_class") is None  # as asked
    assert allocations.defaults(ask, "x", ["sh"], None, "batch", cfg) == {}  # its own command, name and class


# -- the session ----------------------------------------------------------------------------------


def test_a_session_is_refused_for_a_batch_job_and_with_a_rank(t) -> None:
    status, body = _refused(_url(t, t.running, session=1), t.alice)
    assert status == 400 and body["field"] == "session", body
    jid = _running_alloc(t)
    for q in ({"rank": 1}, {"node": "node-0"}, {"session": "maybe"}):
        status, body = _refused(_url(t, jid, **{"session": 1, **q}), t.alice)
        assert status == 400 and body["field"] == "session", (q, body)
    t.p.admin.post(f"/api/v1/jobs/{jid}/cancel")


@pytest.mark.parametrize("code, state, reason", [(0, "COMPLETED", "None"), (3, "FAILED", "NonZeroExitCode")])
def test_the_sessions_exit_ends_the_allocation_with_its_code(t, code: int, state: str, reason: str) -> None:
    jid = _running_alloc(t)
    _, got = asyncio.run(_session(_url(t, jid, session=1, cmd=["sh", "-c", f"echo J=$SLURM_JOB_ID; exit {code}"]),
                                  t.alice))
    assert got == code
    j = t.p.job(jid)
    assert j["interactive"] == {"kind": "alloc", "exit": code}
    end = _ended(t, jid)
    assert (end["state"], end["reason"], end["exit_code"]) == (state, reason, code)
    kinds = [e["kind"] for e in t.p.events(jid)]
    assert "job.session_end" in kinds and kinds.index("job.attach") < kinds.index("job.session_end")
    attach = next(e for e in t.p.events(jid) if e["kind"] == "job.attach")
    assert attach["data"]["session"] is True and attach["data"]["rank"] == 0


def test_a_plain_terminals_exit_ends_nothing(t) -> None:
    jid = _running_alloc(t)
    _, got = asyncio.run(_session(_url(t, jid, cmd=["sh", "-c", "exit 4"]), t.alice))
    assert got == 4
    t.p.step()
    j = t.p.job(jid)
    assert j["state"] == "RUNNING" and j["interactive"] == {"kind": "alloc"}
    t.p.admin.post(f"/api/v1/jobs/{jid}/cancel")


def test_a_client_that_goes_away_ends_nothing_and_is_detached(t) -> None:
    jid = _running_alloc(t)
    asyncio.run(_session(_url(t, jid, session=1, cmd=["sh", "-c", "echo up.; exec sleep 1000"]), t.alice, until=b"up."))
    sessions = t.p.cp.sessions
    deadline = time.monotonic() + 10
    while sessions.attached(jid):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    t.p.step()
    j = t.p.job(jid)
    assert j["state"] == "RUNNING" and "exit" not in j["interactive"]
    assert sessions.detached_since(jid, 0.0) is not None
    t.p.admin.post(f"/api/v1/jobs/{jid}/cancel")


def test_a_terminal_is_attached_while_open_touched_by_input_and_told_the_loops_warnings(t) -> None:
    jid = _running_alloc(t)
    sessions = t.p.cp.sessions

    async def go() -> bytes:
        out = b""
        async with connect(_url(t, jid, cmd=["sh", "-c", "echo ready.; read x; echo got-$x."]),
                           additional_headers={"Authorization": f"Bearer {t.alice}"}) as ws:
            while b"ready." not in out:
                out += await asyncio.wait_for(ws.recv(), 10)
            assert sessions.attached(jid) == 1 and sessions.detached_since(jid, 0.0) is None
            before = sessions.last_input(jid)
            await asyncio.sleep(0.05)
            t.p.clock.advance(7)  # the registry reads the plane's (fake) clock
            assert await asyncio.to_thread(sessions.warn, jid, "idle: ending in 60 s") == 1
            await ws.send(b"yes\n")
            while b"got-yes." not in out:
                msg = await asyncio.wait_for(ws.recv(), 10)
                out += msg if isinstance(msg, bytes) else b""
            assert sessions.last_input(jid) >= before + 7
        return out

    out = asyncio.run(go())
    assert b"\r\n[yard] idle: ending in 60 s\r\n" in out
    t.p.admin.post(f"/api/v1/jobs/{jid}/cancel")


# -- release --------------------------------------------------------------------------------------


def test_release_ends_a_running_allocation_as_completed(t) -> None:
    jid = _running_alloc(t)
    r = t.p.client(t.alice).post(f"/api/v1/jobs/{jid}/release")
    assert r.status_code == 200, r.text
    end = _ended(t, jid)
    assert (end["state"], end["reason"], end["interactive"]) == ("COMPLETED", "None", {"kind": "alloc", "exit": 0})
    assert t.p.client(t.alice).post(f"/api/v1/jobs/{jid}/release").status_code == 409  # ended


def test_release_cancels_a_waiting_allocation_and_releases_a_held_ones_hold(t) -> None:
    jid = _alloc(t, begin="now+1hour")
    r = t.p.client(t.alice).post(f"/api/v1/jobs/{jid}/release")
    assert r.status_code == 200, r.text
    assert (r.json()["state"], r.json()["reason"]) == ("CANCELLED", "released before it started")
    held = _alloc(t, hold=True)
    r = t.p.client(t.alice).post(f"/api/v1/jobs/{held}/release")
    assert r.status_code == 200 and r.json()["state"] == "PENDING" and not r.json()["held"], r.text
    t.p.admin.post(f"/api/v1/jobs/{held}/cancel")


def test_release_of_a_batch_job_is_409_and_only_who_may_attach_may(t) -> None:
    r = t.p.client(t.alice).post(f"/api/v1/jobs/{t.running}/release")
    assert r.status_code == 409 and "not held" in r.json()["detail"], r.text
    jid = _running_alloc(t)
    for who in ("bob", "nora", "viewer", "operator", "job_token"):
        r = t.p.client(getattr(t, who)).post(f"/api/v1/jobs/{jid}/release")
        assert r.status_code == 403, (who, r.text)
    assert t.p.job(jid)["state"] == "RUNNING"
    t.p.admin.post(f"/api/v1/jobs/{jid}/cancel")


def test_json_of_the_job_view_carries_the_record(t) -> None:
    jid = _running_alloc(t)
    listed = t.p.client(t.alice).get("/api/v1/jobs", params={"fields": "id,interactive"}).json()["jobs"]
    assert {"id": jid, "interactive": {"kind": "alloc"}} in listed
    assert json.loads(json.dumps(t.p.job(jid)))["interactive"]["kind"] == "alloc"
    t.p.admin.post(f"/api/v1/jobs/{jid}/cancel")
