"""Idle allocations on a real `yard up` (local backend, root plane, a real Unix account as the owner),
with the session attached through the API as `yard alloc` attaches it (the `session=1` WebSocket,
through `websockets`), a class with `idle_timeout: 4s` and `idle_warning: 2s`:

- an allocation whose session sits idle gets the warning in its terminal and on the owner's
  webhook (a real HTTP receiver; the job asked for no mail), then ends TIMEOUT with reason
  IdleTimeout, which `yard acct` and `yard show` show;
- one kept busy by a CPU loop in its shell (the shell is in the rank's cell: its CPU counts) does
  not end, and gets no warning.

The step's logic to the fake second: tests/control/loop/test_idle.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.accounts import ROOT_ONLY, accounts, shared_dir
from tests.cli.test_alloc_yard_up import running_allocation, session_url
from tests.cli.test_mail_webhook import Receiver
from tests.plane import TWO_TEAMS, YARD, YardServer

pytestmark = [ROOT_ONLY, pytest.mark.xdist_group("alloc-idle-yard-up")]
IDLE_TIMEOUT_S, WARNING_S = 4, 2


@pytest.fixture(scope="module")
def up():
    hook = Receiver()
    with accounts({"alice": ["vis"]}, ["vis"]) as acc, shared_dir("tyidle") as d:
        cfg = d / "config.yaml"
        text = TWO_TEAMS.read_text().replace("max_run_time: 8h, grace_period: 0}",
                                             f"max_run_time: 8h, grace_period: 0, idle_timeout: {IDLE_TIMEOUT_S}s}}")
        assert "idle_timeout" in text
        cfg.write_text(text + f"interactive: {{idle_warning: {WARNING_S}s, connection_grace: 60s}}\n"
                       f"notify: {{webhook: '{hook.url}', timeout_s: 2}}\n"
                       f"users:\n  alice: {acc.user('alice')}\n")
        server = YardServer(d / "yard", config_file=cfg)
        (d / "yard").mkdir()
        admin = server.start()
        try:
            token = admin.post("/api/v1/tokens", json={"user": "alice", "role": "member", "team": "vision"}).json()["token"]
            alice = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
            yield server, alice, token, hook, d
        finally:
            for j in admin.get("/api/v1/jobs", params={"active": "true"}).json()["jobs"]:
                admin.post(f"/api/v1/jobs/{j['id']}/cancel")
            time.sleep(1)
            server.terminate()
            hook.stop()


def _alloc(up) -> int:
    _server, alice, _token, _hook, d = up
    return running_allocation(alice, d)


def _ws(server, jid: int) -> str:
    return session_url(server.url, jid)


async def _read_until(ws, out: bytearray, mark: bytes, timeout: float) -> None:
    async def go() -> None:
        while mark not in out:
            msg = await ws.recv()
            if isinstance(msg, bytes):
                out.extend(msg)
    await asyncio.wait_for(go(), timeout)


def _yard(server, token: str, *args: str) -> str:
    p = subprocess.run([YARD, *args], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "YARD_URL": server.url, "YARD_TOKEN": token})
    assert p.returncode == 0, f"yard {' '.join(args)} → {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def test_an_idle_session_is_warned_then_ends_with_idle_timeout(up) -> None:
    server, alice, token, hook, _ = up
    jid = _alloc(up)

    async def go() -> tuple[bytes, float, float]:
        out = bytearray()
        async with connect(_ws(server, jid), additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            await ws.send(b"echo up''.\n")
            await _read_until(ws, out, b"up.", 20)
            typed = time.monotonic()  # the last input
            await _read_until(ws, out, b"[yard] ", IDLE_TIMEOUT_S + 10)
            await _read_until(ws, out, b"\r\n", 5)
            warned = time.monotonic()
            async for msg in ws:  # the allocation ends: its shell with it, and the session closes
                if isinstance(msg, bytes):
                    out.extend(msg)
        return bytes(out), typed, warned

    out, typed, warned = asyncio.run(go())
    text = out.decode(errors="replace")
    assert "IdleTimeout" in text and "input" in text, text
    # the warning comes idle_warning before the end (a sample or two of slack on a busy machine)
    assert IDLE_TIMEOUT_S - WARNING_S - 0.5 <= warned - typed <= IDLE_TIMEOUT_S + 1.5, warned - typed
    deadline = time.monotonic() + 20
    while (j := alice.get(f"/api/v1/jobs/{jid}").json())["state"] != "TIMEOUT":
        assert time.monotonic() < deadline, j
        time.sleep(0.1)
    assert j["reason"] == "IdleTimeout", j
    kinds = [e["kind"] for e in alice.get(f"/api/v1/jobs/{jid}/events").json()["events"]]
    assert kinds.count("job.idle_warning") == 1 and kinds.count("job.idle") == 1, kinds
    acct = _yard(server, token, "acct", "-j", str(jid), "-o", "jobid,state,reason", "-P", "-n")
    assert acct.strip().splitlines() == [f"{jid}|TIMEOUT|IdleTimeout"], acct
    assert "IdleTimeout" in _yard(server, token, "show", str(jid))
    bodies = hook.wait_events(jid, 1, timeout=20)
    assert [b["event"] for b in bodies][:1] == ["IDLE_WARNING"] and bodies[0]["user"] == "alice", bodies


def test_a_session_kept_busy_by_a_cpu_loop_does_not_end(up) -> None:
    server, alice, token, hook, _ = up
    jid = _alloc(up)

    async def go() -> bytes:
        out = bytearray()
        async with connect(_ws(server, jid), additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            await ws.send(b"echo busy''.; while :; do :; done\n")
            await _read_until(ws, out, b"busy.", 20)
            try:  # no input from here on: only the loop's CPU keeps it
                await _read_until(ws, out, b"[yard] ", 2 * IDLE_TIMEOUT_S + 2)
            except TimeoutError:
                pass
            assert alice.get(f"/api/v1/jobs/{jid}").json()["state"] == "RUNNING"
            await ws.send(b"\x03")  # Ctrl-C ends the loop; the shell leaves
            await ws.send(b"exit\n")
            async for msg in ws:
                if isinstance(msg, bytes):
                    out.extend(msg)
        return bytes(out)

    out = asyncio.run(go())
    assert b"[yard]" not in out, out.decode(errors="replace")
    kinds = [e["kind"] for e in alice.get(f"/api/v1/jobs/{jid}/events").json()["events"]]
    assert "job.idle_warning" not in kinds and "job.idle" not in kinds, kinds
    deadline = time.monotonic() + 20
    while (j := alice.get(f"/api/v1/jobs/{jid}").json())["state"] not in ("COMPLETED", "FAILED"):
        assert time.monotonic() < deadline, j
        time.sleep(0.1)
