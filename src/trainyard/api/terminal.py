"""The bytes of `yard shell`: a WebSocket on one side, a pseudo-terminal's master on the other.

`serve` refuses before the handshake completes (an HTTP status and `{"detail", "field"}`, as
every other route answers) anything `services/terminals.py` refuses, so no process starts for a
caller who may not. Once accepted, `Pump` carries:

    pty output            → binary frames (read when the fd is readable, never more than
                            `QUEUED` chunks ahead of a slow client: then reading pauses)
    binary frames         → the pty (the line discipline makes Ctrl-C a SIGINT to the
                            foreground group, not to the session)
    text frames (JSON)    {"resize": [rows, cols]} → TIOCSWINSZ (the kernel sends SIGWINCH),
                          {"pipe": true} → no echo, no CR before LF (`yard shell` in a pipe)
    the process ends      → its last output, a text frame {"exit": N} (N: its code, or 128 +
                            the signal), a normal close
    the client goes away  → SIGHUP to the process's group and the terminal's foreground group,
                            SIGKILL after `HANGUP_GRACE_S`; the process is always reaped here.

Every terminal registers in the plane's `sessions` (services/sessions.py): attached when accepted,
touched by each binary frame (input), detached at the end; the loop's warnings reach the client as
`\r\n[yard] <text>\r\n` in its output. An allocation's session (`session=1`) ends the allocation
when its process exits (`terminals.session_ended`, before the exit frame goes out); when the
client goes away it ends nothing (the loop's connection grace does).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import logging
import os
import signal
import struct
import termios
from typing import Any, Callable

from fastapi import WebSocket
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from trainyard.api import deps
from trainyard.backends.base import Terminal
from trainyard.services import terminals
from trainyard.services.errors import ServiceError
from trainyard.services.sessions import Attachment, Sessions

log = logging.getLogger("trainyard.api.terminal")

HANGUP_GRACE_S = 3.0
CHUNK = 65536
QUEUED = 64  # chunks read ahead of the client before reading pauses
MAX_CONTROL = 4096  # bytes of a text frame


async def serve(ws: WebSocket, job_text: str) -> None:
    """Check, open, accept, pump; or refuse with the status the services' error maps to."""
    cp = ws.app.state.plane
    try:
        job_id = terminals.parse_job_id(job_text)
        ask = terminals.parse_ask(ws.query_params.multi_items())
        by = await deps.principal(ws.headers.get("authorization"), cp)
        term, _, _ = await run_in_threadpool(terminals.open_terminal, cp, by, job_id, ask)
        on_exit = (lambda code: terminals.session_ended(cp, by, job_id, code)) if ask.session else None
    except ServiceError as e:
        await refuse(ws, e.status, e.message, e.field)
        return
    try:
        await ws.accept()
    except BaseException:
        terminals.discard(term)
        raise
    await Pump(ws, term, job_id=job_id, sessions=cp.sessions, on_exit=on_exit).run()


def control_message(text: str) -> dict[str, Any] | None:
    """A client's text frame as a JSON object (a terminal's resize, a port's end of input); None for
    anything else, which the pumps ignore: a client's mistake ends nothing."""
    if len(text) > MAX_CONTROL:
        return None
    try:
        msg: Any = json.loads(text)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) else None


async def refuse(ws: WebSocket, status: int, message: str, field: str | None) -> None:
    """A refusal before the handshake completes, as every HTTP route answers one (`{"detail",
    "field"}` with the status); the terminal and the port routes both use it."""
    try:
        await ws.send_denial_response(JSONResponse({"detail": message, "field": field}, status_code=status))
    except RuntimeError:  # a server without the denial extension: a close before the handshake (403)
        await ws.close(code=1008, reason=message[:120])


def _pgroups(term: Terminal) -> set[int]:
    """The process's group and the terminal's foreground one, never the plane's own."""
    out = set()
    for get in (lambda: os.getpgid(term.pid), lambda: os.tcgetpgrp(term.fd)):
        try:
            out.add(get())
        except OSError:
            pass
    return out - {os.getpgrp(), 0}


def _signal_all(term: Terminal, sig: int) -> None:
    for g in _pgroups(term):
        try:
            os.killpg(g, sig)
        except OSError:
            pass
    try:
        os.kill(term.pid, sig)
    except OSError:
        pass


class Pump:
    """One accepted terminal's life (see the module docstring). `sessions`, `job_id`: the registry
    it attaches to; `on_exit(code)`: called (on a worker thread) when the process exits while the
    client is there (an allocation's session)."""

    def __init__(self, ws: WebSocket, term: Terminal, *, job_id: int | None = None, sessions: Sessions | None = None,
                 on_exit: Callable[[int], None] | None = None):
        self.ws, self.term = ws, term
        self.job_id, self.sessions, self.on_exit = job_id, sessions, on_exit
        self.attachment: Attachment | None = None
        self.out: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.status: int | None = None  # the wait status, once reaped
        self.reading = False
        self.eof = False

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        os.set_blocking(self.term.fd, False)
        if self.sessions is not None and self.job_id is not None:
            self.attachment = self.sessions.attach(self.job_id, lambda text: self._notify(loop, text))
        self._read_on(loop)
        exited = asyncio.Event()
        pidfd = self._watch_exit(loop, exited)
        sender = asyncio.create_task(self._send_output())
        receiver = asyncio.create_task(self._receive())
        ended = asyncio.create_task(exited.wait())
        try:
            await asyncio.wait({receiver, ended}, return_when=asyncio.FIRST_COMPLETED)
            if ended.done() or self._reap():
                receiver.cancel()
                self._drain()
                await sender
                await self._reap_soon()
                await self._exited()
                await self._send_exit()
            else:  # the client went away (or sent what cannot be read): hang up
                sender.cancel()
                await self._hang_up(exited)
        finally:
            if self.attachment is not None:
                self.attachment.detach()
            for t in (sender, receiver, ended):
                t.cancel()
            self._read_off(loop)
            if pidfd is not None:
                loop.remove_reader(pidfd)
                os.close(pidfd)
            if self.status is None:
                _signal_all(self.term, signal.SIGKILL)
                await run_in_threadpool(self._reap, True)
            os.close(self.term.fd)

    # -- the process's end ------------------------------------------------------------------------

    def _watch_exit(self, loop: asyncio.AbstractEventLoop, exited: asyncio.Event) -> int | None:
        """A pidfd that becomes readable when the process ends; else a poll every 50 ms."""
        try:
            pidfd = os.pidfd_open(self.term.pid)
        except (AttributeError, OSError):
            async def poll() -> None:
                while not self._reap():
                    await asyncio.sleep(0.05)
                exited.set()
            self._poller = asyncio.create_task(poll())
            return None
        def ended() -> None:
            loop.remove_reader(pidfd)  # readable for good from now on
            self._reap()
            exited.set()
        loop.add_reader(pidfd, ended)
        return pidfd

    def _reap(self, block: bool = False) -> bool:
        """Wait for the process (once); True when it has ended."""
        if self.status is None:
            try:
                pid, status = os.waitpid(self.term.pid, 0 if block else os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost
                pid, status = self.term.pid, 255 << 8
            if pid == self.term.pid:
                self.status = status
        return self.status is not None

    async def _hang_up(self, exited: asyncio.Event) -> None:
        _signal_all(self.term, signal.SIGHUP)
        _signal_all(self.term, signal.SIGCONT)  # a stopped job would not see the hang-up
        try:
            await asyncio.wait_for(exited.wait(), HANGUP_GRACE_S)
        except asyncio.TimeoutError:
            _signal_all(self.term, signal.SIGKILL)
        await run_in_threadpool(self._reap, True)

    async def _exited(self) -> None:
        """The process ended with the client there: `on_exit` told its code (its failure is logged,
        never the client's problem: the allocation then ends by its grace or time limit)."""
        if self.on_exit is None or self.status is None:
            return
        try:
            await run_in_threadpool(self.on_exit, terminals.exit_code(self.status))
        except Exception:  # noqa: BLE001
            log.exception("job %s: the session's end could not be recorded", self.job_id)

    def _notify(self, loop: asyncio.AbstractEventLoop, text: str) -> None:
        """From any thread: `text` into the client's output as a line of its own."""
        line = f"\r\n[yard] {text}\r\n".encode(errors="replace")
        loop.call_soon_threadsafe(self.out.put_nowait, line)

    async def _send_exit(self) -> None:
        await self._reap_soon()
        code = terminals.exit_code(self.status) if self.status is not None else 255
        try:
            await self.ws.send_text(json.dumps({"exit": code}))
            await self.ws.close(1000)
        except Exception:  # noqa: BLE001 - the client left first: nothing to tell
            pass

    async def _reap_soon(self) -> None:
        for _ in range(100):
            if self._reap():
                return
            await asyncio.sleep(0.01)
        await run_in_threadpool(self._reap, True)

    # -- output -------------------------------------------------------------------------------------

    def _read_on(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.reading and not self.eof:
            loop.add_reader(self.term.fd, self._readable)
            self.reading = True

    def _read_off(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.reading:
            loop.remove_reader(self.term.fd)
            self.reading = False

    def _read_once(self) -> bytes | None:
        """A chunk; b"" when nothing is there now; None at the end (EIO: no one holds the terminal)."""
        try:
            data = os.read(self.term.fd, CHUNK)
        except BlockingIOError:
            return b""
        except OSError as e:
            if e.errno != errno.EIO:
                raise
            return None
        return data or None

    def _readable(self) -> None:
        data = self._read_once()
        if data is None:
            self.eof = True
            self._read_off(asyncio.get_running_loop())
            self.out.put_nowait(None)
        elif data:
            self.out.put_nowait(data)
            if self.out.qsize() >= QUEUED:
                self._read_off(asyncio.get_running_loop())

    def _drain(self) -> None:
        """After the process ended: what it left in the terminal, at most `QUEUED` chunks, then the end."""
        self._read_off(asyncio.get_running_loop())
        for _ in range(QUEUED):
            if self.eof:
                break
            data = self._read_once()
            if not data:
                break
            self.out.put_nowait(data)
        if not self.eof:
            self.eof = True
            self.out.put_nowait(None)

    async def _send_output(self) -> None:
        loop = asyncio.get_running_loop()
        while (data := await self.out.get()) is not None:
            try:
                await self.ws.send_bytes(data)
            except Exception:  # noqa: BLE001 - the client left: its receive ends the pump
                return
            if self.out.qsize() < QUEUED // 4:
                self._read_on(loop)

    # -- input --------------------------------------------------------------------------------------

    async def _receive(self) -> None:
        """Until the client goes away: its bytes to the terminal, its control messages applied."""
        while True:
            msg = await self.ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
            if msg.get("bytes"):
                if self.attachment is not None:
                    self.attachment.touch()  # plane's own: the sessions registry's clock, no file
                await self._write(msg["bytes"])
            elif msg.get("text"):
                self._control(msg["text"])

    async def _write(self, data: bytes) -> None:
        while data:
            try:
                n = os.write(self.term.fd, data)
            except BlockingIOError:
                await asyncio.sleep(0.005)  # the terminal's input is full: the command is not reading
                continue
            except OSError:
                return  # the process is gone; its end is on its way
            data = data[n:]

    def _control(self, text: str) -> None:
        """A JSON control message; anything else is ignored (a client's mistake ends nothing)."""
        msg = control_message(text)
        if msg is None:
            return
        size = msg.get("resize")
        if isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) and 1 <= v <= terminals.MAX_SIDE
                                                             for v in size):
            try:
                fcntl.ioctl(self.term.fd, termios.TIOCSWINSZ, struct.pack("HHHH", size[0], size[1], 0, 0))
            except OSError:
                pass
        if msg.get("pipe") is True:
            try:
                attrs = termios.tcgetattr(self.term.fd)
                attrs[1] &= ~termios.ONLCR
                attrs[3] &= ~termios.ECHO
                termios.tcsetattr(self.term.fd, termios.TCSANOW, attrs)
            except termios.error:
                pass
