"""`/api/v1/jobs/{id}/port/{port}` (issue 38, `yard port-forward`): who may connect, and the bytes it carries.

A real uvicorn on loopback over the fake plane (tests/api/terminal_plane.py), a real `websockets`
client, and real TCP servers in this process standing for the job's: the fake backend's
`open_port` is a plain connection to this machine's loopback. The connection made as the owner
inside a rank: tests/backends/local/test_port.py; the CLI on a real `yard up`: tests/cli/test_port_forward.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlencode

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosedOK, InvalidStatus

from tests.api import terminal_plane

pytestmark = pytest.mark.xdist_group("port-api")  # one plane and server per module


@pytest.fixture(scope="module")
def t(tmp_path_factory):
    served, server, thread = terminal_plane.serve(tmp_path_factory.mktemp("ports") / "d")
    yield served
    terminal_plane.stop(served, server, thread)


class Server:
    """A TCP server on 127.0.0.1 standing for the job's: `handle(conn)` per connection, on a thread."""

    def __init__(self, handle: Callable[[socket.socket], None]):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.handle = handle
        self.errors: list[BaseException] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            with conn:
                self.handle(conn)
        except BaseException as e:  # noqa: BLE001 - the test reads them
            self.errors.append(e)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[socket.socket], None]], Server]]:
    made: list[Server] = []

    def make(handle: Callable[[socket.socket], None]) -> Server:
        made.append(Server(handle))
        return made[-1]
    yield make
    for s in made:
        s.close()


def echo(conn: socket.socket) -> None:
    while data := conn.recv(65536):
        conn.sendall(data)


def _url(t: terminal_plane.Served, job: int | str, port: int | str, **q: object) -> str:
    return f"ws{t.url[4:]}/api/v1/jobs/{job}/port/{port}" + (f"?{urlencode(q)}" if q else "")


def _ws(url: str, token: str):
    return connect(url, additional_headers={"Authorization": f"Bearer {token}"}, max_size=2**22, compression=None)


def _refused(url: str, token: str) -> tuple[int, dict]:
    async def go() -> tuple[int, dict]:
        try:
            async with _ws(url, token):
                pass
        except InvalidStatus as e:
            return e.response.status_code, json.loads(e.response.body or b"{}")
        raise AssertionError("the port was forwarded")
    return asyncio.run(go())


def _events(t: terminal_plane.Served) -> list[dict]:
    return [e for e in t.p.events(t.running) if e["kind"] == "job.port_forward"]


def test_bytes_go_both_ways_and_the_connection_is_an_attached_session(t, serve) -> None:
    srv = serve(echo)
    sessions = t.p.cp.sessions

    async def go() -> tuple[bytes, int]:
        async with _ws(_url(t, t.running, srv.port), t.alice) as ws:
            await ws.send(b"ping-1")
            first = await ws.recv()
            attached = sessions.attached(t.running)
            before = sessions.last_input(t.running)
            t.p.clock.advance(5)  # the plane's time (a fake clock here)
            await ws.send(b"ping-2")
            second = await ws.recv()
            assert sessions.last_input(t.running) == before + 5  # each client frame is input
        return first + second, attached

    data, attached = asyncio.run(go())
    assert data == b"ping-1ping-2"
    assert attached == 1
    deadline = time.monotonic() + 5
    while sessions.attached(t.running) != 0:  # detached once the client left
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_megabytes_each_way_arrive_intact_and_the_clients_eof_reaches_the_server(t, serve) -> None:
    """5 MB from the job's side; 3 MB to it, which it hashes once it reads its end of file."""
    down, up = os.urandom(5 << 20), os.urandom(3 << 20)

    def handle(conn: socket.socket) -> None:
        conn.sendall(down)
        h = hashlib.sha256()
        while data := conn.recv(65536):
            h.update(data)
        conn.sendall(h.hexdigest().encode())  # then it closes

    srv = serve(handle)

    async def go() -> tuple[bytes, int | None]:
        got = b""
        async with _ws(_url(t, t.running, srv.port), t.alice) as ws:
            for i in range(0, len(up), 100_000):
                await ws.send(up[i:i + 100_000])
            await ws.send(json.dumps({"eof": True}))
            try:
                async for msg in ws:
                    got += msg
            except ConnectionClosedOK:
                pass
            return got, ws.close_code

    got, code = asyncio.run(go())
    assert len(got) == len(down) + 64 and got[:len(down)] == down
    assert got[len(down):] == hashlib.sha256(up).hexdigest().encode()
    assert code == 1000  # the job side's end is a normal close
    assert srv.errors == []


def test_the_job_side_closing_ends_the_websocket_normally(t, serve) -> None:
    srv = serve(lambda conn: conn.sendall(b"bye"))

    async def go() -> tuple[list, int | None]:
        async with _ws(_url(t, t.running, srv.port), t.alice) as ws:
            msgs = [m async for m in ws]
            return msgs, ws.close_code

    msgs, code = asyncio.run(go())
    assert b"".join(msgs) == b"bye" and code == 1000


def test_the_client_leaving_closes_the_connection(t, serve) -> None:
    ended = threading.Event()

    def handle(conn: socket.socket) -> None:
        conn.sendall(b"hello")
        conn.settimeout(20)
        if conn.recv(10) == b"":
            ended.set()

    srv = serve(handle)

    async def go() -> bytes:
        async with _ws(_url(t, t.running, srv.port), t.alice) as ws:
            return await ws.recv()

    assert asyncio.run(go()) == b"hello"
    assert ended.wait(10), "the job's server never saw the connection end"


def test_the_forward_is_audited_once_for_many_connections(t, serve) -> None:
    srv = serve(echo)
    before = len(_events(t))

    async def one(rank: int) -> None:
        async with _ws(_url(t, t.running, srv.port, rank=rank), t.p.admin_token) as ws:
            await ws.send(b"x")
            assert await ws.recv() == b"x"

    for _ in range(3):
        asyncio.run(one(1))
    new = _events(t)[before:]
    assert len(new) == 1, new
    assert new[0]["actor"] == "admin" and new[0]["data"]["rank"] == 1 and new[0]["data"]["port"] == srv.port
    assert new[0]["node"] == new[0]["data"]["node"] and new[0]["data"]["role"] == "admin"
    asyncio.run(one(0))  # another rank: another event
    assert len(_events(t)[before:]) == 2


@pytest.mark.parametrize("who", ["bob", "nora", "operator", "viewer", "job_token"])
def test_only_the_owner_and_admins_may(t, serve, who: str) -> None:
    srv = serve(echo)
    before = len(_events(t))
    status, body = _refused(_url(t, t.running, srv.port), getattr(t, who))
    assert status == 403, body
    assert "forward a port" in body["detail"]
    assert len(_events(t)) == before  # nothing connected, nothing recorded


def test_no_token_is_401(t, serve) -> None:
    assert _refused(_url(t, t.running, serve(echo).port), "")[0] == 401


def test_an_unknown_job_is_404_a_pending_one_409_and_nothing_listening_502(t, serve) -> None:
    port = serve(echo).port
    assert _refused(_url(t, 99999, port), t.alice)[0] == 404
    status, body = _refused(_url(t, t.pending, port), t.alice)
    assert status == 409 and "not RUNNING" in body["detail"]
    free = socket.create_server(("127.0.0.1", 0))
    closed = free.getsockname()[1]
    free.close()
    status, body = _refused(_url(t, t.running, closed), t.alice)
    assert status == 502 and body["field"] == "port", body
    assert f"nothing listens on port {closed} in job {t.running} rank 0" in body["detail"]


@pytest.mark.parametrize("port, q, field", [(0, {}, "port"), (65536, {}, "port"), ("x", {}, "port"),
                                            (80, {"rank": 7}, "rank"), (80, {"rank": "x"}, "rank"),
                                            (80, {"node": "nowhere"}, "node"), (80, {"rank": 0, "node": "n"}, "node"),
                                            (80, {"bogus": 1}, "bogus")])
def test_bad_input_names_the_field(t, port: object, q: dict, field: str) -> None:
    status, body = _refused(_url(t, t.running, port, **q), t.alice)
    assert status == 400 and body["field"] == field, body


def test_a_helpers_pipes_are_carried_too_and_the_helper_is_reaped(t, serve, monkeypatch) -> None:
    """The Slurm backend's kind of tunnel (a relay's stdout and stdin, its pid): the relay run here
    directly in place of srun, through the same pump."""
    from trainyard.backends.rundir.port import relay_argv, start_relay

    srv = serve(echo)
    started: list[int] = []

    def open_port(job_id: int, attempt: int, rank: int, port: int):
        tunnel = start_relay(relay_argv("/usr/bin/python3", port), {"PATH": "/usr/bin:/bin"})
        started.append(tunnel.pid)
        return tunnel

    monkeypatch.setattr(t.p.backend, "open_port", open_port)

    async def go() -> bytes:
        async with _ws(_url(t, t.running, srv.port), t.alice) as ws:
            await ws.send(b"through-pipes")
            return await ws.recv()

    assert asyncio.run(go()) == b"through-pipes"
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{started[0]}"):  # a zombie counts: the pump must reap it
        assert time.monotonic() < deadline, "the relay was not ended and reaped"
        time.sleep(0.05)
