"""Interactive allocations on a real `yard up` (local backend, root plane, a real Unix account as the
owner): the session's WebSocket (`session=1`) straight through `websockets`, as `yard alloc` uses it.

- the session's shell has the job's environment and runs as the owner, never root; its `exit`
  ends the allocation COMPLETED and frees its GPU within 2 s (the figure is printed);
- a client that drops its connection ends it CANCELLED ConnectionLost after the (short) grace;
- another team's member and a job token get 403.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.accounts import ROOT_ONLY, accounts, shared_dir
from tests.plane import TWO_TEAMS, YARD, YardServer

pytestmark = [ROOT_ONLY, pytest.mark.xdist_group("alloc-yard-up")]
GRACE_S = 3


@pytest.fixture(scope="module")
def up():
    with accounts({"alice": ["vis"]}, ["vis"]) as acc, shared_dir("tyalloc") as d:
        cfg = d / "config.yaml"
        cfg.write_text(TWO_TEAMS.read_text() + f"interactive: {{connection_grace: {GRACE_S}s}}\n"
                       + f"users:\n  alice: {acc.user('alice')}\n")
        server = YardServer(d / "yard", config_file=cfg)
        (d / "yard").mkdir()
        admin = server.start()
        try:
            tokens = {u: admin.post("/api/v1/tokens", json={"user": u, "role": "member", "team": t}).json()["token"]
                      for u, t in (("alice", "vision"), ("nora", "nlp"))}
            alice = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {tokens['alice']}"},
                                 timeout=10)
            yield server, admin, alice, tokens, acc, d
        finally:
            for j in admin.get("/api/v1/jobs", params={"active": "true"}).json()["jobs"]:
                admin.post(f"/api/v1/jobs/{j['id']}/cancel")
            time.sleep(1)
            server.terminate()


def running_allocation(client, workdir) -> int:
    """A 1-GPU allocation of team vision submitted through the API as `yard alloc` does, once RUNNING."""
    r = client.post("/api/v1/jobs", json={"interactive": {"kind": "alloc"}, "gpus": 1, "team": "vision",
                                          "workdir": str(workdir)})
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    deadline = time.monotonic() + 60
    while (j := client.get(f"/api/v1/jobs/{jid}").json())["state"] != "RUNNING":
        assert time.monotonic() < deadline, j
        time.sleep(0.1)
    return jid


def session_url(base: str, jid: int, **q) -> str:
    """The WebSocket address of the allocation's session (`session=1`) on the plane at `base`."""
    from urllib.parse import urlencode

    return f"ws{base[4:]}/api/v1/jobs/{jid}/terminal?{urlencode({'session': 1, **q})}"


def _alloc(up) -> int:
    _server, _admin, alice, *_, d = up
    return running_allocation(alice, d)


def _ws(server, jid: int, **q) -> str:
    return session_url(server.url, jid, **q)


def _gpus_used(admin) -> int:
    return sum(n["gpus_used"] for n in admin.get("/api/v1/nodes").json()["nodes"])


async def _read_until(ws, out: bytearray, mark: bytes, timeout: float = 20) -> None:
    async def go() -> None:
        while mark not in out:
            msg = await ws.recv()
            if isinstance(msg, bytes):
                out.extend(msg)
    await asyncio.wait_for(go(), timeout)


def test_the_session_is_the_owners_shell_with_the_jobs_environment_and_exit_ends_it(up) -> None:
    server, admin, alice, tokens, acc, _ = up
    jid = _alloc(up)
    used = _gpus_used(admin)

    async def go() -> tuple[bytes, float, int | None]:
        out = bytearray()
        async with connect(_ws(server, jid), additional_headers={"Authorization": f"Bearer {tokens['alice']}"}) as ws:
            await ws.send(b"echo J=$SLURM_JOB_ID C=$CUDA_VISIBLE_DEVICES U=$(id -un) I=$(id -u) N=$SLURM_JOB_NODELIST.\n")
            await _read_until(ws, out, b"N=node")
            await _read_until(ws, out, b".\r\n")
            t0 = time.monotonic()
            await ws.send(b"exit\n")
            code = None
            async for msg in ws:
                if isinstance(msg, str):
                    code = json.loads(msg).get("exit", code)
        return bytes(out), t0, code

    out, t0, code = asyncio.run(go())
    assert code == 0
    m = re.search(rb"J=(\d+) C=(\S*) U=(\S+) I=(\d+) N=(\S+)\.", out)
    assert m, out
    assert int(m[1]) == jid and m[2] != b"" and m[3].decode() == acc.user("alice") and int(m[4]) != 0, out
    while (j := alice.get(f"/api/v1/jobs/{jid}").json())["state"] != "COMPLETED" or _gpus_used(admin) != used - 1:
        assert time.monotonic() - t0 < 10, j
        time.sleep(0.02)
    took = time.monotonic() - t0
    print(f"\nexit → COMPLETED and the GPU free: {took:.2f} s")
    assert took <= 2.0, took
    assert j["interactive"] == {"kind": "alloc", "exit": 0} and j["reason"] == "None"
    ev = alice.get(f"/api/v1/jobs/{jid}/events").json()["events"]
    assert [e["data"]["exit"] for e in ev if e["kind"] == "job.session_end"] == [0]


def test_a_failing_sessions_code_is_the_jobs_in_acct_and_show(up) -> None:
    server, admin, alice, tokens, *_ = up
    jid = _alloc(up)

    async def go() -> int | None:
        code = None
        async with connect(_ws(server, jid, cmd="sh", rows=30),
                           additional_headers={"Authorization": f"Bearer {tokens['alice']}"}) as ws:
            await ws.send(b"exit 3\n")
            async for msg in ws:
                if isinstance(msg, str):
                    code = json.loads(msg).get("exit", code)
        return code

    assert asyncio.run(go()) == 3
    _wait_state(alice, jid, "FAILED")
    acct = _yard(server, tokens["alice"], "acct", "-j", str(jid), "-o", "state,exitcode,reason%30", "-P", "-n")
    assert acct.strip() == "FAILED|3:0|NonZeroExitCode", acct
    show = _yard(server, tokens["alice"], "show", str(jid))
    assert re.search(r"reason: NonZeroExitCode", show) and re.search(r"exit_code: 3", show), show
    assert "interactive: alloc, session exited 3" in show, show


def _wait_state(alice, jid: int, state: str, within: float = 20) -> dict:
    deadline = time.monotonic() + within
    while (j := alice.get(f"/api/v1/jobs/{jid}").json())["state"] != state:
        assert time.monotonic() < deadline, j
        time.sleep(0.1)
    return j


def _yard(server, token: str, *args: str) -> str:
    p = subprocess.run([YARD, *args], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "YARD_URL": server.url, "YARD_TOKEN": token})
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_a_dropped_connection_ends_the_allocation_after_the_grace(up) -> None:
    server, admin, alice, tokens, *_ = up
    jid = _alloc(up)

    async def go() -> float:
        out = bytearray()
        async with connect(_ws(server, jid), additional_headers={"Authorization": f"Bearer {tokens['alice']}"}) as ws:
            await ws.send(b"echo up''.\n")
            await _read_until(ws, out, b"up.")
            ws.transport.abort()  # the laptop's network goes: no close frame, no exit
        return time.monotonic()

    left = asyncio.run(go())
    time.sleep(GRACE_S - 1.5)
    assert alice.get(f"/api/v1/jobs/{jid}").json()["state"] == "RUNNING"
    while (j := alice.get(f"/api/v1/jobs/{jid}").json())["state"] != "CANCELLED":
        assert time.monotonic() - left < GRACE_S + 10, j
        time.sleep(0.1)
    assert j["reason"] == "ConnectionLost" and "exit" not in j["interactive"]
    acct = _yard(server, tokens["alice"], "acct", "-j", str(jid), "-o", "state,reason%30", "-P", "-n")
    assert acct.strip() == "CANCELLED|ConnectionLost", acct
    lost = [e for e in alice.get(f"/api/v1/jobs/{jid}/events").json()["events"] if e["kind"] == "job.connection_lost"]
    assert len(lost) == 1 and f"{GRACE_S}s" in lost[0]["message"]


def test_another_teams_member_and_a_job_token_get_403(up) -> None:
    server, admin, alice, tokens, *_ = up
    jid = _alloc(up)

    async def refused(token: str) -> int:
        try:
            async with connect(_ws(server, jid), additional_headers={"Authorization": f"Bearer {token}"}):
                pass
        except InvalidStatus as e:
            return e.response.status_code
        return 101

    async def go() -> None:
        out = bytearray()  # the owner's session stays open meanwhile: the grace is not what is tested
        async with connect(_ws(server, jid), additional_headers={"Authorization": f"Bearer {tokens['alice']}"}) as ws:
            await ws.send(b"echo T''=$TRAINYARD_TOKEN.\n")  # the echoed line has T''=, the output T=
            await _read_until(ws, out, b"T=")
            await _read_until(ws, out, b".\r\n", timeout=10)
            m = re.search(rb"T=(\S+)\.\r\n", bytes(out))
            assert m, bytes(out)
            job_token = m[1].decode()
            assert await refused(tokens["nora"]) == 403
            assert await refused(job_token) == 403
            async with httpx.AsyncClient(base_url=server.url) as c:
                for token in (tokens["nora"], job_token):
                    r = await c.post(f"/api/v1/jobs/{jid}/release", headers={"Authorization": f"Bearer {token}"})
                    assert r.status_code == 403, r.text
            assert (await asyncio.to_thread(alice.get, f"/api/v1/jobs/{jid}")).json()["state"] == "RUNNING"
            r = await asyncio.to_thread(alice.post, f"/api/v1/jobs/{jid}/release")
            assert r.status_code == 200, r.text
    asyncio.run(go())
    assert _wait_state(alice, jid, "COMPLETED")["interactive"] == {"kind": "alloc", "exit": 0}
