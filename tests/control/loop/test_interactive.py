"""The loop's interactive step (control/loop/interactive.py) on the fake backend and a fake clock:
an allocation with nothing attached ends after `interactive.connection_grace`, to the fake second.

The registry is the plane's own (`cp.sessions`), attached here as the terminal's pump attaches it
(api/terminal.py); the pump's own part, with real WebSockets: tests/api/test_allocations.py; a
dropped client on a real `yard up`: tests/cli/test_alloc_yard_up.py.
"""

from __future__ import annotations

import pytest
from sqlalchemy import event

from tests.fake_plane import FakePlane, fake
from tests.plane import TWO_TEAMS
from trainyard.backends.fake import parse_program

GRACE = 30


@pytest.fixture
def fp(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(TWO_TEAMS.read_text() + f"interactive: {{connection_grace: {GRACE}s}}\n")
    p = FakePlane(tmp_path / "yard", config=config)
    p.backend.programs["/bin/bash"] = parse_program(["yard-fake"])[0]  # the hold script: runs until stopped
    yield p
    p.stop()


def _alloc(fp: FakePlane) -> dict:
    j = fp.submit(interactive={"kind": "alloc"}, gpus=1, team="vision")
    return fp.wait(j["id"], "RUNNING")


def test_an_allocation_never_attached_ends_after_the_grace_from_its_start(fp) -> None:
    j = _alloc(fp)
    fp.run(GRACE - 2)
    assert fp.job(j["id"])["state"] == "RUNNING"
    end = fp.wait(j["id"], "CANCELLED", timeout=30)
    assert end["reason"] == "ConnectionLost"
    lost = [e for e in fp.events(j["id"]) if e["kind"] == "job.connection_lost"]
    assert len(lost) == 1 and f"{GRACE}s" in lost[0]["message"] and "connection_grace" in lost[0]["message"]
    assert GRACE <= lost[0]["time"] - j["start_time"] < GRACE + 2  # a pass a fake second


def test_an_attached_allocation_runs_on_and_ends_a_grace_after_its_last_detach(fp) -> None:
    j = _alloc(fp)
    att = fp.cp.sessions.attach(j["id"])
    fp.run(3 * GRACE)
    assert fp.job(j["id"])["state"] == "RUNNING"
    second = fp.cp.sessions.attach(j["id"])  # two terminals: one leaving keeps it
    att.detach()
    fp.run(2 * GRACE)
    assert fp.job(j["id"])["state"] == "RUNNING"
    second.detach()
    left = fp.clock()
    fp.run(GRACE - 2)
    assert fp.job(j["id"])["state"] == "RUNNING"
    end = fp.wait(j["id"], "CANCELLED", timeout=30)
    assert end["reason"] == "ConnectionLost"
    at = next(e["time"] for e in fp.events(j["id"]) if e["kind"] == "job.connection_lost")
    assert GRACE <= at - left < GRACE + 2
    fp.step()  # the backend stops reporting the ended attempt
    assert fp.cp.sessions.last_input(j["id"]) is None  # the ended job is forgotten


def test_reattaching_within_the_grace_keeps_it(fp) -> None:
    j = _alloc(fp)
    fp.run(GRACE - 5)
    att = fp.cp.sessions.attach(j["id"])
    fp.run(GRACE)
    att.detach()
    fp.run(GRACE - 5)
    assert fp.job(j["id"])["state"] == "RUNNING"
    fp.admin.post(f"/api/v1/jobs/{j['id']}/cancel")


def test_a_batch_job_with_nothing_attached_is_not_touched(fp) -> None:
    j = fp.submit(command=fake("run=100000"), gpus=1, team="vision")
    fp.wait(j["id"], "RUNNING")
    fp.run(3 * GRACE)
    assert fp.job(j["id"])["state"] == "RUNNING"
    assert not [e for e in fp.events(j["id"]) if e["kind"] == "job.connection_lost"]


def test_a_stopping_allocation_is_left_to_its_stop(fp) -> None:
    fp.backend.programs["/bin/bash"] = parse_program(["yard-fake", "term=ignore"])[0]  # SIGKILL only
    j = _alloc(fp)
    fp.admin.post(f"/api/v1/jobs/{j['id']}/cancel")
    end = fp.wait(j["id"], "CANCELLED", timeout=3 * GRACE)
    assert end["reason"].startswith("Cancel")
    assert not [e for e in fp.events(j["id"]) if e["kind"] == "job.connection_lost"]


def test_the_step_asks_the_store_nothing_when_no_allocation_runs(fp) -> None:
    j = fp.submit(command=fake("run=100000"), gpus=2, team="vision")
    fp.wait(j["id"], "RUNNING")
    statements: list[str] = []
    engine = fp.cp.loop_store.engine
    listen = lambda *a: statements.append(a[2])  # noqa: E731 - (conn, cursor, statement, ...)
    loop = fp.cp.loop
    facts_of = lambda: __import__("trainyard.control.loop.context", fromlist=["Facts"]).Facts(  # noqa: E731
        loop.ctx.backend.poll(), loop.ctx.backend.inventory())
    facts = facts_of()
    loop.interactive.run(facts, fp.clock())  # the attempt is learnt (at most once)
    event.listen(engine, "before_cursor_execute", listen)
    try:
        for _ in range(5):
            loop.interactive.run(facts, fp.clock())
    finally:
        event.remove(engine, "before_cursor_execute", listen)
    assert statements == []
