"""The bytes of `yard port-forward`: a WebSocket on one side, a connection into the job on the other.

`serve` refuses before the handshake completes (an HTTP status and `{"detail", "field"}`, as
`api/terminal.py` does) anything `services/ports.py` refuses, so no connection is made for a
caller who may not. Once accepted, `PortPump` carries one TCP connection:

    the job side's bytes    → binary frames, one read (at most `CHUNK` bytes) at a time: the
                              next read waits for the frame to be sent, so a slow client slows
                              the job's side down instead of filling the plane's memory
    binary frames           → the job side (each written whole before the next is received:
                              a job that does not read slows the client down the same way)
    a text frame {"eof": true}  the client's side will send nothing more: the job side's write
                              half is shut (its server reads an end of file), replies still flow
    the job side's end      → its last bytes, a normal close (1000)
    the client goes away    → the connection is closed (the job's server sees it end)

Each connection registers in the plane's `sessions` (no notify: a port has no terminal to warn),
touched on every client frame: a notebook used through its port is not idle, and an allocation
with a forwarded port attached has not lost its connection.
"""

from __future__ import annotations

import asyncio
import os
import socket

from fastapi import WebSocket
from starlette.concurrency import run_in_threadpool

from trainyard.api import deps
from trainyard.api.terminal import control_message, refuse
from trainyard.backends.base import Tunnel
from trainyard.services import ports, terminals
from trainyard.services.errors import ServiceError
from trainyard.services.sessions import Attachment

CHUNK = 65536
HELPER_GRACE_S = 3.0  # a relay's time to end once its pipes are closed


async def serve(ws: WebSocket, job_text: str, port_text: str) -> None:
    """Check, connect, accept, pump; or refuse with the status the services' error maps to."""
    cp = ws.app.state.plane
    try:
        job_id = terminals.parse_job_id(job_text)
        ask = ports.parse_ask(port_text, ws.query_params.multi_items())
        by = await deps.principal(ws.headers.get("authorization"), cp)
        tunnel, _, _ = await run_in_threadpool(ports.open_port, cp, by, job_id, ask)
    except ServiceError as e:
        await refuse(ws, e.status, e.message, e.field)
        return
    try:
        await ws.accept()
    except BaseException:
        ports.discard(tunnel)
        raise
    att = cp.sessions.attach(job_id, None)
    try:
        await PortPump(ws, tunnel, att).run()
    finally:
        att.detach()


class PortPump:
    """One accepted connection's life (see the module docstring)."""

    def __init__(self, ws: WebSocket, tunnel: Tunnel, att: Attachment | None = None):
        self.ws, self.tunnel, self.att = ws, tunnel, att
        self.write_shut = False
        self.open_fds = {tunnel.read_fd, tunnel.write_fd}  # closed once each, never twice

    async def run(self) -> None:
        for fd in self.open_fds:
            os.set_blocking(fd, False)
        up = asyncio.create_task(self._to_client())
        down = asyncio.create_task(self._to_job())
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            if up.done():  # the job's side ended (or the client stopped taking frames)
                down.cancel()
                try:
                    await self.ws.close(1000)
                except Exception:  # noqa: BLE001 - the client left first: nothing to tell
                    pass
        finally:
            for t in (up, down):
                t.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            self._close()
            if self.tunnel.pid is not None:
                await run_in_threadpool(ports.end_helper, self.tunnel.pid, HELPER_GRACE_S)

    def _close(self, fds: set[int] | None = None) -> None:
        for fd in set(self.open_fds if fds is None else fds) & self.open_fds:
            self.open_fds.discard(fd)
            try:
                os.close(fd)
            except OSError:
                pass

    async def _ready(self, fd: int, write: bool) -> None:
        """Until `fd` is readable (writable)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def ready() -> None:
            if not done.done():
                done.set_result(None)
        add, remove = (loop.add_writer, loop.remove_writer) if write else (loop.add_reader, loop.remove_reader)
        add(fd, ready)
        try:
            await done
        finally:
            remove(fd)

    async def _to_client(self) -> None:
        """The job side's bytes as binary frames, until its end (or the client's)."""
        fd = self.tunnel.read_fd
        while True:
            try:
                data = os.read(fd, CHUNK)
            except BlockingIOError:
                await self._ready(fd, write=False)
                continue
            except OSError:  # reset by the job's side: its end all the same
                return
            if not data:
                return
            try:
                await self.ws.send_bytes(data)
            except Exception:  # noqa: BLE001 - the client left: the pump ends
                return

    async def _to_job(self) -> None:
        """Until the client goes away: its binary frames to the job side, its control messages applied."""
        while True:
            msg = await self.ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
            if self.att is not None:
                self.att.touch()  # plane's own: the sessions registry (services/sessions.py), no file
            if msg.get("bytes"):
                await self._write(msg["bytes"])
            elif msg.get("text"):
                self._control(msg["text"])

    async def _write(self, data: bytes) -> None:
        if self.write_shut:
            return  # after the client's own end of file: nothing more is its to send
        fd, view = self.tunnel.write_fd, memoryview(data)
        while view:
            try:
                n = os.write(fd, view)
            except BlockingIOError:
                await self._ready(fd, write=True)
                continue
            except OSError:
                return  # the job's side is gone; its end is on its way to `_to_client`
            view = view[n:]

    def _control(self, text: str) -> None:
        """A JSON control message; anything else is ignored (a client's mistake ends nothing)."""
        msg = control_message(text)
        if msg is not None and msg.get("eof") is True and not self.write_shut:
            self.write_shut = True
            self._shut_write()

    def _shut_write(self) -> None:
        """The job side's write half shut: a socket's `shutdown`, a relay's stdin closed."""
        t = self.tunnel
        if t.write_fd == t.read_fd:
            sock = socket.socket(fileno=t.write_fd)
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            finally:
                sock.detach()
        else:
            self._close({t.write_fd})
