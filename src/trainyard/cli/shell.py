"""`yard shell JOB [--rank R | --node N] [-- CMD ...]`: a terminal in a running job, through the API.

As `srun --jobid=JOB --overlap --pty bash`, from anywhere `YARD_URL` reaches: a WebSocket to
`/api/v1/jobs/{id}/terminal` (api/routers/terminal.py) with the token in the Authorization
header, so no SSH key to any node is needed. On a terminal the local one is put in raw mode while
attached (every key, Ctrl-C and Ctrl-Z included, goes to the remote command) and restored on every
way out; a window size change is sent along (SIGWINCH). When stdin is not a terminal the remote
one stops echoing (and ending lines with CR LF), and stdin's end is the command's end of input,
so scripts can pipe through it.

Exit status: the remote command's (128 + its signal); 2 when the server refuses (no such job, not
running, not yours: its one-line reason); 1 when it cannot be reached or the connection is lost.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import termios
import tty
from dataclasses import dataclass
from typing import Any, Optional
from urllib.parse import urlencode

import typer

from trainyard.cli.client import server_url, token
from trainyard.cli.common import EXIT_BAD_INPUT, fail
from trainyard.cli.safe_text import clean

EXIT_UNAVAILABLE = 1
EOF = b"\x04"  # the terminal's end-of-input character (VEOF) in canonical mode


def shell(job: int = typer.Argument(..., min=1, help="a running job's id"),
          rank: Optional[int] = typer.Option(None, "--rank", "-r", min=0, help="the rank to join (default 0)"),
          node: Optional[str] = typer.Option(None, "--node", "-w", help="the job's first rank on this node"),
          cmd: Optional[list[str]] = typer.Argument(None, help="the command after `--` (default: the job's shell)")) -> None:
    """A shell (or CMD) in a running job's rank, as its owner, with the rank's environment."""
    if rank is not None and node is not None:
        fail("give --rank or --node, not both")
    url = ws_url(server_url(), job, rank, node, cmd or [], *size())
    raise typer.Exit(asyncio.run(attach(url, token(), sys.stdin.isatty())))


def ws_url(base: str, job: int, rank: int | None, node: str | None, argv: list[str], rows: int, cols: int,
           session: bool = False) -> str:
    """The route's ws(s) address for the API's http(s) one, with the query (`session`: the terminal
    is an allocation's session, `yard alloc`'s: its end ends the job)."""
    scheme, sep, rest = base.partition("://")
    if not sep or scheme not in ("http", "https"):
        fail(f"YARD_URL: {base!r} is not an http:// or https:// address")
    q: list[tuple[str, Any]] = [("rows", rows), ("cols", cols)]
    q += [("session", 1)] if session else []
    q += [("rank", rank)] if rank is not None else []
    q += [("node", node)] if node is not None else []
    q += [("cmd", a) for a in argv]
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest.rstrip('/')}/api/v1/jobs/{job}/terminal?{urlencode(q)}"


def size() -> tuple[int, int]:
    """(rows, columns) of the terminal this runs on (not $LINES/$COLUMNS, which a resize leaves stale)."""
    for fd in (0, 1, 2):
        try:
            s = os.get_terminal_size(fd)
            break
        except OSError:
            continue
    else:
        s = shutil.get_terminal_size((80, 24))
    return max(1, min(s.lines, 1000)), max(1, min(s.columns, 1000))


def _refusal(status: int, body: bytes | bytearray) -> str:
    try:
        data = json.loads(body)
        return str(data.get("detail") or f"HTTP {status}")
    except (ValueError, AttributeError):
        return f"HTTP {status}"


@dataclass
class Ended:
    """How a terminal ended: `code` is the exit status for the command; `how` is "exit" (the remote
    command's status), "refused" (the server said no: `status`, `message`), "unreachable", "lost"
    (the connection went before an exit status came) or "signal" (SIGTERM/SIGHUP here)."""

    code: int
    how: str
    status: int | None = None
    message: str = ""


async def attach(url: str, tok: str | None, is_tty: bool) -> int:
    """Connect, carry the bytes, and return the exit status (see the module docstring)."""
    ws = await connect(url, tok)
    if isinstance(ws, Ended):
        typer.echo(f"error: {ws.message}", err=True)
        return ws.code
    async with ws:
        return (await Session(ws, is_tty).run()).code


async def connect(url: str, tok: str | None) -> Any:
    """The WebSocket, open; or `Ended` ("refused" or "unreachable", with the one-line reason), nothing printed."""
    from websockets.asyncio.client import connect as ws_connect
    from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI

    try:
        return await ws_connect(url, additional_headers={"Authorization": f"Bearer {tok or ''}"}, compression=None,
                                max_size=2**22, open_timeout=30, ping_interval=20, ping_timeout=60)
    except InvalidStatus as e:
        status = e.response.status_code
        return Ended(EXIT_BAD_INPUT if 400 <= status < 500 else EXIT_UNAVAILABLE, "refused", status,
                     clean(_refusal(status, e.response.body or b"")))
    except InvalidURI as e:
        return Ended(EXIT_BAD_INPUT, "refused", None, f"YARD_URL: {clean(str(e))}")
    except (OSError, InvalidHandshake, asyncio.TimeoutError) as e:
        return Ended(EXIT_UNAVAILABLE, "unreachable", None,
                     f"cannot reach the trainyard server at {url.split('/api/')[0]}: {clean(str(e))}")


class Session:
    """One open terminal's bytes both ways, the local terminal raw meanwhile (see the module docstring)."""

    def __init__(self, ws: Any, is_tty: bool):
        self.ws, self.is_tty = ws, is_tty
        self.code: int | None = None

    async def run(self) -> Ended:
        loop = asyncio.get_running_loop()
        saved = termios.tcgetattr(0) if self.is_tty else None
        me = asyncio.current_task()
        stops = (signal.SIGTERM, signal.SIGHUP)
        try:
            if saved is not None:
                tty.setraw(0, termios.TCSANOW)
                loop.add_signal_handler(signal.SIGWINCH, self._resized)
            else:
                await self.ws.send(json.dumps({"pipe": True}))
            for sig in stops:
                loop.add_signal_handler(sig, lambda: me.cancel() if me is not None else None)
            sender = asyncio.create_task(self._send_input(loop))
            try:
                await self._receive()
            finally:
                sender.cancel()
        except asyncio.CancelledError:
            return Ended(128 + signal.SIGTERM, "signal")
        finally:
            for sig in (*stops, signal.SIGWINCH):
                loop.remove_signal_handler(sig)
            if saved is not None:
                termios.tcsetattr(0, termios.TCSADRAIN, saved)
        if self.code is None:
            typer.echo("error: the connection to the trainyard server was lost", err=True)
            return Ended(EXIT_UNAVAILABLE, "lost")
        return Ended(self.code, "exit")

    def _resized(self) -> None:
        rows, cols = size()
        asyncio.ensure_future(self._send(json.dumps({"resize": [rows, cols]})))

    async def _send(self, msg: str | bytes) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            await self.ws.send(msg)
        except ConnectionClosed:
            pass

    async def _receive(self) -> None:
        from websockets.exceptions import ConnectionClosed

        out = sys.stdout.buffer
        try:
            async for msg in self.ws:
                if isinstance(msg, bytes):
                    out.write(msg)
                    out.flush()
                    continue
                try:
                    data = json.loads(msg)
                except ValueError:
                    continue
                if isinstance(data, dict) and isinstance(data.get("exit"), int):
                    self.code = data["exit"]
        except ConnectionClosed:
            pass

    async def _send_input(self, loop: asyncio.AbstractEventLoop) -> None:
        q: asyncio.Queue[bytes] = asyncio.Queue()

        def readable() -> None:
            try:
                data = os.read(0, 65536)
            except OSError:
                data = b""
            q.put_nowait(data)
            if not data:
                loop.remove_reader(0)

        try:
            loop.add_reader(0, readable)
        except (PermissionError, OSError):  # a regular file: read it on a thread, a chunk at a time
            async def from_file() -> None:
                while data := await asyncio.to_thread(os.read, 0, 65536):
                    q.put_nowait(data)
                q.put_nowait(b"")
            asyncio.ensure_future(from_file())
        last = b"\n"
        try:
            while data := await q.get():
                await self._send(data)
                last = data[-1:]
            if not self.is_tty:  # the end of a pipe: the command's end of input
                await self._send(EOF if last == b"\n" else EOF + EOF)
        finally:
            loop.remove_reader(0)
