"""`/api/v1/jobs/{id}/terminal` (issue 38, `yard shell`): who may open one, and the bytes it carries.

A real uvicorn on loopback over the fake plane (tests/api/terminal_plane.py), a real `websockets`
client, a real pseudo-terminal behind it. The CLI on a real terminal: tests/cli/test_shell.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.api import terminal_plane
from trainyard.api.terminal import HANGUP_GRACE_S

pytestmark = pytest.mark.xdist_group("terminal-api")  # one plane and server per module


@pytest.fixture(scope="module")
def t(tmp_path_factory):
    served, server, thread = terminal_plane.serve(tmp_path_factory.mktemp("terminal") / "d")
    yield served
    terminal_plane.stop(served, server, thread)


def _url(t: terminal_plane.Served, job: int | str, **q: Any) -> str:
    from urllib.parse import urlencode

    items = [(k, v) for k, v in q.items() if k != "cmd"] + [("cmd", a) for a in q.get("cmd", [])]
    return f"ws{t.url[4:]}/api/v1/jobs/{job}/terminal?{urlencode(items)}"


async def _session(url: str, token: str, send: list[bytes | str] = (), until: bytes | None = None,
                   timeout: float = 20.0) -> tuple[bytes, int | None]:
    """Connect, send, collect output until `until` (then leave) or the exit message."""
    out, code = b"", None
    async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        for m in send:
            await ws.send(m)

        async def read() -> None:
            nonlocal out, code
            async for msg in ws:
                if isinstance(msg, bytes):
                    out += msg
                    if until is not None and until in out:
                        return
                else:
                    code = json.loads(msg).get("exit", code)
        await asyncio.wait_for(read(), timeout)
    return out, code


def _refused(url: str, token: str) -> tuple[int, dict]:
    async def go() -> tuple[int, dict]:
        try:
            async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}):
                pass
        except InvalidStatus as e:
            return e.response.status_code, json.loads(e.response.body or b"{}")
        raise AssertionError("the terminal was opened")
    return asyncio.run(go())


def test_the_owner_runs_a_command_and_gets_its_output_and_exit_code(t) -> None:
    out, code = asyncio.run(_session(_url(t, t.running, cmd=["sh", "-c", "echo hi-$MARK; exit 3"]), t.alice))
    assert b"hi-x42" in out  # the rank's environment
    assert code == 3


def test_a_signal_is_128_plus_it(t) -> None:
    _, code = asyncio.run(_session(_url(t, t.running, cmd=["sh", "-c", "kill -TERM $$"]), t.alice))
    assert code == 128 + 15


def test_input_reaches_the_command_and_resize_reaches_stty(t) -> None:
    script = [json.dumps({"resize": [33, 101]}), b"stty size; exit 0\n"]
    out, code = asyncio.run(_session(_url(t, t.running, cmd=["sh"]), t.alice, script))
    assert b"33 101" in out and code == 0


def test_rank_and_node_choose_the_rank(t) -> None:
    out, _ = asyncio.run(_session(_url(t, t.running, rank=1, cmd=["sh", "-c", "echo R=$RANK"]), t.alice))
    assert b"R=1" in out
    node = t.p.job(t.running)["placement"][0]["node"]
    out, _ = asyncio.run(_session(_url(t, t.running, node=node, cmd=["sh", "-c", "echo R=$RANK"]), t.alice))
    assert b"R=0" in out


def test_an_admin_may_and_the_attach_is_audited(t) -> None:
    _, code = asyncio.run(_session(_url(t, t.running, rank=1, cmd=["true"]), t.p.admin_token))
    assert code == 0
    ev = [e for e in t.events() if e["actor"] == "admin"][-1]
    assert ev["data"]["rank"] == 1 and ev["data"]["argv"] == ["true"] and ev["node"] == ev["data"]["node"]


@pytest.mark.parametrize("hup", ["", "trap '' HUP; "])  # a command that ignores SIGHUP is killed after the grace
def test_a_client_that_goes_away_hangs_up_the_process_and_it_is_reaped(t, hup: str) -> None:
    out, _ = asyncio.run(_session(_url(t, t.running, cmd=["sh", "-c", f"{hup}echo ready $$.; exec sleep 1000"]),
                                  t.alice, until=b"."))
    pid = int(out.split(b"ready ")[1].split(b".")[0])
    left = time.monotonic()
    while _alive(pid):  # a zombie counts: the pump must reap it
        assert time.monotonic() - left < HANGUP_GRACE_S + 10, f"{pid} still there"
        time.sleep(0.05)
    took = time.monotonic() - left
    assert (took > HANGUP_GRACE_S - 0.5) if hup else (took < HANGUP_GRACE_S - 0.5), took


def _alive(pid: int) -> bool:
    """`pid` exists, a zombie included (only the plane, its parent, can reap it)."""
    return os.path.exists(f"/proc/{pid}")


@pytest.mark.parametrize("who", ["bob", "nora", "operator", "viewer", "job_token"])
def test_only_the_owner_and_admins_may(t, who: str) -> None:
    before = len(t.events())
    status, body = _refused(_url(t, t.running, cmd=["true"]), getattr(t, who))
    assert status == 403, body
    assert "terminal" in body["detail"]
    assert len(t.events()) == before  # nothing started, nothing recorded


def test_no_token_is_401(t) -> None:
    assert _refused(_url(t, t.running), "")[0] == 401


def test_an_unknown_job_is_404_and_a_pending_one_409(t) -> None:
    assert _refused(_url(t, 99999), t.alice)[0] == 404
    status, body = _refused(_url(t, t.pending), t.alice)
    assert status == 409 and "not RUNNING" in body["detail"]


@pytest.mark.parametrize("q, field", [({"rank": 7}, "rank"), ({"rank": "x"}, "rank"), ({"rows": 0}, "rows"),
                                      ({"node": "nowhere"}, "node"), ({"rank": 0, "node": "node0"}, "node"),
                                      ({"bogus": 1}, "bogus")])
def test_bad_input_names_the_field(t, q: dict, field: str) -> None:
    status, body = _refused(_url(t, t.running, **q), t.alice)
    assert status == 400 and body["field"] == field, body


def test_operators_may_where_the_configuration_lets_them(t) -> None:
    """`interactive.operators_may_attach: true`: an operator's terminal opens (and is audited as
    theirs); a viewer still may not; back to false, the operator is refused again."""
    admin = t.p.client(t.p.admin_token)
    text = admin.get("/api/v1/cluster/config").json()["text"]

    def apply(extra: str) -> None:
        r = admin.post("/api/v1/cluster/config", json={"text": text + extra, "message": "operators"})
        assert r.status_code == 200, r.text
    apply("\ninteractive: {operators_may_attach: true}\n")
    try:
        _, code = asyncio.run(_session(_url(t, t.running, cmd=["true"]), t.operator))
        assert code == 0
        assert t.events()[-1]["data"]["role"] == "operator"
        assert _refused(_url(t, t.running, cmd=["true"]), t.viewer)[0] == 403
    finally:
        apply("\ninteractive: {operators_may_attach: false}\n")
    status, body = _refused(_url(t, t.running, cmd=["true"]), t.operator)
    assert status == 403 and "operators" not in body["detail"]
