"""`yard port-forward JOB [LOCAL:]REMOTE [--rank R | --node N] [--address 127.0.0.1]`: a local
listener whose connections reach a port inside a running job, through the API.

As `kubectl port-forward`: `8888` forwards local 8888 to the job's 8888, `9000:8888` local 9000,
`:8888` or `0:8888` a free local port (printed). Each local connection is a WebSocket of its own
to `/api/v1/jobs/{id}/port/{port}` (api/routers/ports.py) with the user's token in the
Authorization header, so `YARD_URL` reaching the plane is enough: no SSH key to any node. The
plane connects *as the job's owner, inside the rank's network* (127.0.0.1:REMOTE there, then
[::1]:REMOTE) and carries the bytes; a local end of file is passed on as a half-close (the job's
server reads its end of input and may still answer).

At start one WebSocket is tried first, so that a job that is not running or not the caller's
fails at once (exit 1, the server's reason); a port nothing listens on yet is only a warning (a
notebook's server may still be starting), as are such refusals later. A refusal that says the
job cannot be reached any more (403, 404, 409: it ended) is printed once and ends the command
with exit 1. Ctrl-C ends it with exit 0. A bad LOCAL:REMOTE is exit 2.

`forward()` is the same in-process, for `yard notebook`: it starts the listener on a thread of
its own, returns once it listens (the bound port), and serves until `Forward.stop()`.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional
from urllib.parse import urlencode

import typer

from trainyard.cli.client import server_url, token
from trainyard.cli.common import fail
from trainyard.cli.safe_text import clean

EXIT_FAILED = 1
CHUNK = 65536
NOT_LISTENING = 502  # the API's answer when nothing listens on the port in the job (field "port")


def port_forward(job: int = typer.Argument(..., min=1, help="a running job's id"),
                 ports: str = typer.Argument(..., metavar="[LOCAL:]REMOTE",
                                             help="REMOTE (LOCAL = REMOTE), LOCAL:REMOTE, or :REMOTE / 0:REMOTE "
                                                  "(a free local port)"),
                 rank: Optional[int] = typer.Option(None, "--rank", "-r", min=0, help="the rank whose port (default 0)"),
                 node: Optional[str] = typer.Option(None, "--node", "-w", help="the job's first rank on this node"),
                 address: str = typer.Option("127.0.0.1", "--address", help="the local address to listen on")) -> None:
    """Forward a local port to a port inside a running job's rank (e.g. TensorBoard, Jupyter)."""
    if rank is not None and node is not None:
        fail("give --rank or --node, not both")
    local, remote = parse_ports(ports)
    url = server_url()
    try:
        ws_url(url, job, remote, rank, node)
    except Refused as e:
        fail(e.message)
    try:
        fwd = forward(url, token(), job, remote, local=local, address=address, rank=rank, node=node)
    except Refused as e:
        typer.echo(f"error: {clean(e.message)}", err=True)
        raise typer.Exit(EXIT_FAILED)
    except OSError as e:
        typer.echo(f"error: cannot listen on {address}:{local}: {e.strerror or e}", err=True)
        raise typer.Exit(EXIT_FAILED)
    typer.echo(f"Forwarding from {_host(address)}:{fwd.port} -> job {job} {fwd.target} port {remote}")
    sys.stdout.flush()
    previous = signal.signal(signal.SIGTERM, lambda *_: fwd.stop_soon())
    try:
        fwd.wait()
    except KeyboardInterrupt:
        pass
    finally:
        fwd.stop()
        signal.signal(signal.SIGTERM, previous)
    raise typer.Exit(EXIT_FAILED if fwd.error else 0)


def parse_ports(text: str) -> tuple[int, int]:
    """(local, remote) of `[LOCAL:]REMOTE` (local 0: a free port); exit 2 naming the argument."""
    local_text, sep, remote_text = text.rpartition(":")
    if not sep:
        local_text = remote_text
    elif local_text == "":
        local_text = "0"
    try:
        local, remote = int(local_text), int(remote_text)
    except ValueError:
        fail(f"[LOCAL:]REMOTE: {text!r} is not a port or LOCAL:REMOTE (e.g. 8888, 9000:8888, :8888)")
    if not 1 <= remote <= 65535:
        fail(f"[LOCAL:]REMOTE: the remote port {remote} is out of range (1..65535)")
    if not 0 <= local <= 65535:
        fail(f"[LOCAL:]REMOTE: the local port {local} is out of range (0..65535; 0: a free one)")
    return local, remote


def ws_url(base: str, job: int, remote: int, rank: int | None, node: str | None) -> str:
    """The route's ws(s) address for the API's http(s) one."""
    scheme, sep, rest = base.partition("://")
    if not sep or scheme not in ("http", "https"):
        raise Refused(0, f"YARD_URL: {base!r} is not an http:// or https:// address", None)
    q = [("rank", str(rank))] if rank is not None else []
    q += [("node", node)] if node is not None else []
    query = f"?{urlencode(q)}" if q else ""
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest.rstrip('/')}/api/v1/jobs/{job}/port/{remote}{query}"


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


class Refused(Exception):
    """The API refused a connection (`status`: its HTTP status; 0: not even asked), or could not be reached."""

    def __init__(self, status: int, message: str, field: str | None):
        super().__init__(message)
        self.status, self.message, self.field = status, message, field

    @property
    def fatal(self) -> bool:
        """The job cannot be reached this way any more: 4xx (not the caller's, no such job or rank,
        not running). Nothing listening yet (502), a server's trouble or no answer are not."""
        return 400 <= self.status < 500


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class Forward:
    """A running forward (see `forward`): `port` the bound local port; `error` the reason it
    ended by itself (a fatal refusal), None while it serves or after `stop()`."""

    port: int
    target: str  # "rank R" or "node N"
    error: str | None = None
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _stop: asyncio.Event | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _done: threading.Event = field(default_factory=threading.Event, repr=False)

    def stop_soon(self) -> None:
        """Ask it to stop (from any thread, a signal handler included); `stop` waits for it too."""
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:  # its loop has just closed
                pass

    def stop(self, timeout: float = 10.0) -> None:
        """Stop listening, end every connection, and wait for its thread."""
        self.stop_soon()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Until it ends (stopped, or a fatal refusal); True when it has. Interruptible by Ctrl-C."""
        if timeout is not None:
            return self._done.wait(timeout)
        while not self._done.wait(0.5):
            pass
        return True

    @property
    def serving(self) -> bool:
        return not self._done.is_set()


def forward(base_url: str, tok: str | None, job: int, remote: int, *, local: int = 0, address: str = "127.0.0.1",
            rank: int | None = None, node: str | None = None,
            say: Callable[[str], None] = _stderr) -> Forward:
    """Listen on `address:local` (0: a free port) and forward each connection to `remote` in the
    job's rank (`rank`, or the first on `node`; neither: rank 0), in the background; returns once
    it listens. `say` gets each warning and error line (default: stderr).

    Raises:
        Refused: the first try was refused for good (not the caller's job, not running, no such
            rank: its `message`) or the server cannot be reached (`status` 0).
        OSError: the local address cannot be listened on.
    """
    url = ws_url(base_url, job, remote, rank, node)
    target = f"node {node}" if node is not None else f"rank {rank or 0}"
    fwd = Forward(0, target)
    started: dict[str, Any] = {}
    ready = threading.Event()
    runner = _Runner(fwd, url, tok, address, local, say, started, ready)
    fwd._thread = threading.Thread(target=runner.main, name=f"port-forward-{job}-{remote}", daemon=True)
    fwd._thread.start()
    ready.wait()
    if "error" in started:
        fwd._thread.join(5)
        raise started["error"]
    fwd.port = started["port"]
    return fwd


class _Runner:
    """The forward's thread: its own event loop, the listener, one task per connection."""

    def __init__(self, fwd: Forward, url: str, tok: str | None, address: str, local: int,
                 say: Callable[[str], None], started: dict[str, Any], ready: threading.Event):
        self.fwd, self.url, self.tok, self.address, self.local = fwd, url, tok, address, local
        self.say, self.started, self.ready = say, started, ready
        self.said: set[str] = set()
        self.tasks: set[asyncio.Task[None]] = set()

    def main(self) -> None:
        try:
            asyncio.run(self._main())
        finally:
            self.fwd._done.set()
            self.ready.set()

    async def _main(self) -> None:
        self.fwd._loop = asyncio.get_running_loop()
        self.fwd._stop = stop = asyncio.Event()
        try:
            await self._probe()
            server = await asyncio.start_server(self._handle, self.address, self.local)
        except (Refused, OSError) as e:
            self.started["error"] = e
            return
        self.started["port"] = server.sockets[0].getsockname()[1]
        self.ready.set()
        try:
            await stop.wait()
        finally:
            server.close()
            for t in list(self.tasks):
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            await server.wait_closed()

    async def _probe(self) -> None:
        """One WebSocket at start: a refusal for good raises, nothing listening yet is a warning."""
        try:
            ws = await self._connect()
        except Refused as e:
            if e.fatal or e.status == 0:  # at start, an unreachable server is an error too
                raise
            self._once(f"warning: {e.message} (yet): forwarding anyway")
            return
        await ws.close()

    async def _connect(self) -> Any:
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI

        try:
            return await connect(self.url, additional_headers={"Authorization": f"Bearer {self.tok or ''}"},
                                 compression=None, max_size=2**22, open_timeout=30, ping_interval=20, ping_timeout=60)
        except InvalidStatus as e:
            status = e.response.status_code
            try:
                body = json.loads(e.response.body or b"{}")
            except ValueError:
                body = {}
            detail = body.get("detail") if isinstance(body, dict) else None
            raise Refused(status, clean(str(detail or f"HTTP {status}")),
                          body.get("field") if isinstance(body, dict) else None) from None
        except InvalidURI as e:
            raise Refused(0, f"YARD_URL: {clean(str(e))}", None) from None
        except (OSError, InvalidHandshake, asyncio.TimeoutError) as e:
            raise Refused(0, f"cannot reach the trainyard server at {self.url.split('/api/')[0]}: {clean(str(e))}",
                          None) from None

    def _once(self, line: str) -> None:
        if line not in self.said:
            self.said.add(line)
            self.say(line)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            try:
                ws = await self._connect()
            except Refused as e:
                self._once(f"error: {e.message}")
                if e.fatal:
                    self.fwd.error = e.message
                    assert self.fwd._stop is not None
                    self.fwd._stop.set()
                return
            async with ws:
                await _Connection(reader, writer, ws).run()
        finally:
            self.tasks.discard(task)
            writer.close()


class _Connection:
    """One local connection and its WebSocket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ws: Any):
        self.reader, self.writer, self.ws = reader, writer, ws

    async def run(self) -> None:
        up = asyncio.create_task(self._up())
        down = asyncio.create_task(self._down())
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            if not down.done() and up.result() is False:  # the local side broke: leave
                await self.ws.close()
            await down  # the job side's end (after a local end of file: its answer first)
        finally:
            for t in (up, down):
                t.cancel()
            await asyncio.gather(up, down, return_exceptions=True)

    async def _up(self) -> bool:
        """Local bytes to the WebSocket; True at a local end of file (passed on), False when broken."""
        from websockets.exceptions import ConnectionClosed

        try:
            while data := await self.reader.read(CHUNK):
                await self.ws.send(data)
            await self.ws.send(json.dumps({"eof": True}))
            return True
        except (ConnectionClosed, OSError):
            return False

    async def _down(self) -> None:
        """The job side's bytes to the local connection, until the WebSocket closes."""
        from websockets.exceptions import ConnectionClosed

        try:
            async for msg in self.ws:
                if isinstance(msg, bytes):
                    self.writer.write(msg)
                    await self.writer.drain()
        except (ConnectionClosed, OSError):
            pass
