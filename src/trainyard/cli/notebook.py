"""`yard notebook [yard alloc's options] [--port LOCAL] [--jupyter CMD]`: JupyterLab in an interactive
allocation, served on a local URL through a forwarded port (issue 38, Deliver 4).

The steps, as a person would take them by hand with `yard alloc`, `jupyter lab` and `yard port-forward`:
1. the local port first (LOCAL, default a free one: bound, so that the URL is known before the job
   exists, and listened on once the forward starts); a random token (`secrets.token_urlsafe`) and a
   port for JupyterLab in the job (REMOTE, at random below Linux's ephemeral range, so no client
   socket on the node holds it);
2. an interactive job of kind "notebook" (`yard submit`'s options, `cli/jobs.py` `job_request`; the
   interactive class unless `-q` says otherwise) whose batch script (`jupyter_script`) starts
   JupyterLab on 127.0.0.1:REMOTE of the allocation's first node, in the job's working directory, as
   the owner, from the job's image or environment (`--jupyter`, default `jupyter lab`: the PATH the
   job gets is the submitting shell's, as sbatch's --export=ALL);
3. the wait for the allocation, as `yard alloc` waits (its state, reason and estimated start);
4. the forwarded port (`cli/port_forward.py`'s `forward`, in this process), then JupyterLab asked
   through it until it answers (`/api/status` with the token) or the job ends (its state, reason
   and the tail of its log; exit 1) or START_TIMEOUT_S passes;
5. `http://127.0.0.1:LOCAL/lab?token=TOKEN` printed on stdout (the only line there), then served
   until Ctrl-C (or SIGTERM/SIGHUP), which releases the allocation (`POST /jobs/{id}/release`:
   COMPLETED) and exits 0; a job that ends meanwhile (its time limit, its idle timeout) is said,
   exit 1. Meanwhile `Keeper` holds the allocation attached (the plane's connection grace) and
   prints the plane's warnings.

The token is a secret: whoever has it is the owner inside JupyterLab (a terminal, the owner's files).
The rest of the job's team reads the job's env, command and logs, so the token is in none of them:
the plane keeps it in the job's interactive record, shown whole only to the owner, admins and the
job's own token (services/allocations.py `shown`), and the script reads it from the plane with the
job's token (TRAINYARD_TOKEN, in the rank's environment, which only the owner can read) into
JupyterLab's environment (JUPYTER_TOKEN), never a command line (`ps` shows those to everyone on the
node). JupyterLab prints its URL with `token=...` in place of a token it did not make itself. The
record also carries the local URL, so the dashboard's job page links to it for the owner: a link
that works in a browser on the machine where `yard notebook` runs.

JupyterLab is kept off the network (a cluster's nodes often have none, and a notebook should not
phone home): no news feed, no update check, the read-only extension manager (the default one asks
PyPI at start).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shlex
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import typer

from trainyard.cli import alloc, jobs
from trainyard.cli.client import Client, server_url
from trainyard.cli.client import token as user_token
from trainyard.cli.common import fail
from trainyard.cli.http import TransportError
from trainyard.cli.safe_text import clean, clean_lines
from trainyard.cli.shared_options import with_options
from trainyard.contracts import JobVar

TOOL = "notebook"  # the prefix of its lines on stderr (the wait's are salloc's words: cli/alloc.py)
REMOTE_PORTS = (20000, 32768)  # JupyterLab's port in the job: [low, high)
START_TIMEOUT_S = 120.0  # from the allocation's start to JupyterLab answering
DEFAULT_JUPYTER = "jupyter lab"
EXIT_FAILED = 1
WATCH_S = 2.0  # how often the job's state is read while the notebook is served
LOG_TAIL = 2048  # bytes of the job's log shown when it ends before JupyterLab answered

# JupyterLab's options after the command: loopback only (the forwarded port is the way in), this port
# or nothing (the client forwards to it), the job's working directory as its root, no network.
JUPYTER_FLAGS = ("--no-browser", "--ip=127.0.0.1", "--ServerApp.port_retries=0", '--ServerApp.root_dir="$PWD"',
                 "--ServerApp.allow_root=True",  # only matters where the owner is root (a plane's tests)
                 "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                 "--LabApp.extension_manager=readonly")

# Reads the notebook's token from the plane with the job's own token (standard library, any python3).
_READ_TOKEN = ("import json, os, urllib.request as u; "
               f"r = u.Request(os.environ['{JobVar.API}'].rstrip('/') + '/api/v1/jobs/' + os.environ['{JobVar.JOB_ID}'], "
               f"headers={{'Authorization': 'Bearer ' + os.environ['{JobVar.TOKEN}']}}); "
               "print(json.load(u.urlopen(r, timeout=30))['interactive']['token'])")


def remote_port() -> int:
    low, high = REMOTE_PORTS
    return low + secrets.randbelow(high - low)


def new_token() -> str:
    return secrets.token_urlsafe(32)


def lab_url(local_port: int, token: str, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{local_port}/lab?token={token}"


def jupyter_script(jupyter: list[str], port: int) -> str:
    """The notebook job's batch script: JupyterLab (`jupyter`: its command words) on 127.0.0.1:`port`
    with the token read from the plane (see the module docstring). `exec`: JupyterLab is the rank's
    process, its end the job's."""
    words = " ".join([shlex.join(jupyter), *JUPYTER_FLAGS, f"--port={port}"])
    return f"""#!/bin/sh
# trainyard: yard notebook. JupyterLab on 127.0.0.1:{port} of the allocation's first node, in the
# job's working directory, until the allocation ends. Its token is read from the plane with the
# job's own token: it is not in this script, the job's environment, a command line or the log.
JUPYTER_TOKEN=$(python3 -I -c "{_READ_TOKEN}") && [ -n "$JUPYTER_TOKEN" ] || {{
  echo "yard notebook: could not read the notebook's token from the plane at ${JobVar.API}" >&2; exit 1; }}
export JUPYTER_TOKEN
jupyter={shlex.quote(jupyter[0])}
command -v "$jupyter" >/dev/null 2>&1 || {{
  echo "yard notebook: $jupyter not found on the job's PATH ($PATH): install JupyterLab in the job's" \\
       "environment or image, or give --jupyter" >&2; exit 127; }}
exec {words}
"""


@with_options(jobs.job_request, drop=(*alloc.NOT_OPTIONS, *alloc.BATCH_ONLY))
def notebook(port: int = typer.Option(0, "--port", min=0, max=65535,
                                      help="the local port to serve the notebook on (default: a free one)"),
             jupyter: str = typer.Option(DEFAULT_JUPYTER, "--jupyter", help="the command that starts JupyterLab in "
                                         "the job, from its image or environment (its PATH is your shell's)"),
             **options: Any) -> None:
    """JupyterLab in an interactive allocation (yard alloc's options), on a local URL through a
    forwarded port: waits for the allocation, prints http://127.0.0.1:PORT/lab?token=… once
    JupyterLab answers, and serves it until Ctrl-C, which ends the allocation."""
    words = shlex.split(jupyter)
    if not words:
        fail("--jupyter: give the command that starts JupyterLab (default: jupyter lab)")
    listener = bind_local(port)
    raise typer.Exit(run(listener, words, options))


def bind_local(port: int) -> socket.socket:
    """The local listener, bound before the job is asked for so that its URL is known; exit 2 when
    the port is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as e:
        sock.close()
        fail(f"--port: cannot listen on 127.0.0.1:{port}: {e.strerror}")
    return sock  # bound, not listening: a browser is refused rather than left hanging until it serves


def run(listener: socket.socket, words: list[str], options: dict[str, Any]) -> int:
    """Ask, wait, forward, serve, release: the exit status (see the module docstring)."""
    token, remote = new_token(), remote_port()
    url = lab_url(listener.getsockname()[1], token)
    body, where = jobs.job_request([], False, {"kind": "notebook", "port": remote, "token": token, "url": url},
                                   **options, **alloc.BATCH_ONLY)
    body["script"] = jupyter_script(words, remote)
    body["name"] = body.get("name") or "notebook"
    c, job_id = Client(), None
    with alloc.on_stop_signals(alloc.raise_stop):
        try:
            job_id = alloc.submit(c, body, where, TOOL)
            alloc.tell(TOOL, f"Pending job allocation {job_id}")
            job = alloc.wait_for_start(c, job_id, TOOL)
        except alloc.Stop:
            if job_id is None:
                alloc.tell(TOOL, "error: interrupted while the allocation was being asked for (see yard queue --me)")
            else:
                alloc.revoke(c, job_id, TOOL)
            return EXIT_FAILED
    if job is None:
        return EXIT_FAILED
    return serve(c, job_id, listener, remote, token, url)


def serve(c: Client, job_id: int, listener: socket.socket, remote: int, token: str, url: str) -> int:
    """Forward the local port to JupyterLab's port in the job, wait until it answers, print its URL
    and serve until a signal (released: 0; 1 before the URL was printed), the job's end or the
    forward's (1)."""
    base = url.split("/lab?")[0]
    with alloc.on_stop_signals(alloc.raise_stop):
        fwd, keeper, served = None, None, False
        try:
            keeper = Keeper(job_id)  # attached from the start: JupyterLab may take longer than the grace
            fwd = start_forward(c, job_id, listener, remote)
            if fwd is None or not wait_ready(c, job_id, base, token, fwd):
                return EXIT_FAILED
            typer.echo(url)
            served = True
            alloc.tell(TOOL, f"JupyterLab of job {job_id} is served on {base}/lab (Ctrl-C ends the allocation)")
            fwd.quiet = False
            while (ended := ended_state(c, job_id)) is None and fwd.serving:
                time.sleep(WATCH_S)
            if ended is not None:
                alloc.tell(TOOL, f"error: job allocation {job_id} ended: {ended}")
            else:  # the notebook cannot be reached any more: no use holding its GPUs
                alloc.tell(TOOL, f"error: the forwarded port of job {job_id} ended: {fwd.error}")
                alloc.relinquish(c, job_id, TOOL)
            return EXIT_FAILED
        except alloc.Stop:  # Ctrl-C, SIGTERM, SIGHUP: the allocation released (0 once it was served)
            alloc.relinquish(c, job_id, TOOL)
            alloc.settle(c, job_id)
            return 0 if served else EXIT_FAILED
        finally:
            if keeper is not None:
                keeper.stop()
            if fwd is not None:
                fwd.stop()


def wait_ready(c: Client, job_id: int, base: str, token: str, fwd: "Forwarding", *,
               timeout: float = START_TIMEOUT_S) -> bool:
    """Ask JupyterLab through the forwarded port until it answers (True); False, said, when the job
    ended first (with its log's tail), the forward ended, or `timeout` passed (then released)."""
    deadline, next_watch = time.monotonic() + timeout, 0.0
    while True:
        if lab_answers(base, token):
            return True
        serving = fwd.serving  # read once: the forward's thread may end it meanwhile
        if not serving or time.monotonic() >= next_watch:
            ended = ended_state(c, job_id) if serving else ended_soon(c, job_id)
            if ended is None and not serving:
                alloc.tell(TOOL, f"error: {fwd.error}")
                alloc.relinquish(c, job_id, TOOL)
                return False
            if ended is not None:
                report_end(c, job_id, ended)
                return False
            next_watch = time.monotonic() + WATCH_S
        if time.monotonic() >= deadline:
            last = f" (last: {fwd.last})" if fwd.last else ""
            alloc.tell(TOOL, f"error: JupyterLab did not answer within {timeout:.0f}s{last}; its log: yard logs {job_id}")
            alloc.relinquish(c, job_id, TOOL)
            return False
        time.sleep(0.5)


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1: never through a proxy


def lab_answers(base: str, token: str) -> bool:
    """JupyterLab answers `/api/status` with the token (HTTP 200, its JSON)."""
    req = urllib.request.Request(f"{base}/api/status", headers={"Authorization": f"token {token}"})
    try:
        with _DIRECT.open(req, timeout=10) as r:
            return r.status == 200 and isinstance(json.loads(r.read(65536)), dict)
    except (OSError, ValueError, urllib.error.URLError):
        return False


def ended_state(c: Client, job_id: int) -> str | None:
    """None while the job runs; else its state and reason, as one phrase."""
    try:
        r = c.http.request("GET", f"/api/v1/jobs/{job_id}")
    except TransportError:
        return None  # the plane unreachable for a moment: the job is not known to have ended
    if r.status_code != 200:
        return None
    job = r.json()
    if job.get("state") in ("RUNNING", "CONFIGURING"):
        return None
    reason = job.get("reason")
    return clean(f"{job.get('state')}" + (f" ({reason})" if reason not in (None, "", "None") else ""))


def ended_soon(c: Client, job_id: int, within: float = 10.0) -> str | None:
    """`ended_state`, given the plane `within` seconds to see an end: a rank that has just exited
    refuses the forward before the job's state says it ended."""
    deadline = time.monotonic() + within
    while (ended := ended_state(c, job_id)) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    return ended


def report_end(c: Client, job_id: int, ended: str) -> None:
    """The job ended before JupyterLab answered: its state and reason (once it has ended, if it was
    still COMPLETING), and the end of its log."""
    alloc.settle(c, job_id)
    ended = ended_state(c, job_id) or ended
    alloc.tell(TOOL, f"error: job {job_id} ended before JupyterLab answered: {ended}")
    tail = log_tail(c, job_id)
    if tail:
        typer.echo(f"--- the end of its log ---\n{tail}", err=True)


def log_tail(c: Client, job_id: int) -> str:
    """The last LOG_TAIL bytes of rank 0's log, whole lines ('' when unreadable)."""
    try:
        r = c.http.request("GET", f"/api/v1/jobs/{job_id}/logs", params={"rank": 0, "offset": -LOG_TAIL})
    except TransportError:
        return ""
    if r.status_code != 200:
        return ""
    lines = r.text.splitlines()
    return clean_lines("\n".join(lines[1:] if len(r.text) >= LOG_TAIL else lines))


class Forwarding:
    """`yard port-forward`'s in-process forward (`port_forward.forward`) and its lines: kept quiet
    while JupyterLab starts (nothing listens on its port yet: expected), said once it serves."""

    def __init__(self) -> None:
        self.quiet, self.last = True, ""
        self.fwd: Any = None

    def say(self, line: str) -> None:
        self.last = line
        if not self.quiet:
            alloc.tell(TOOL, line)

    @property
    def serving(self) -> bool:
        return bool(self.fwd is not None and self.fwd.serving)

    @property
    def error(self) -> str:
        return str(getattr(self.fwd, "error", None) or self.last or "stopped")

    def stop(self) -> None:
        if self.fwd is not None:
            self.fwd.stop()


def start_forward(c: Client, job_id: int, listener: socket.socket, remote: int) -> Forwarding | None:
    """Forward the local port (held by `listener` until now, then listened on by the forward) to
    `remote` in rank 0 of `job_id`; None, said and released, when it cannot."""
    from trainyard.cli import port_forward

    local = listener.getsockname()[1]
    listener.close()
    out = Forwarding()
    try:
        out.fwd = port_forward.forward(server_url(), user_token(), job_id, remote, local=local, say=out.say)
    except port_forward.Refused as e:
        ended = ended_soon(c, job_id)
        if ended is not None:  # JupyterLab failed at once (not found, its port taken)
            report_end(c, job_id, ended)
            return None
        alloc.tell(TOOL, f"error: forwarding to job {job_id}: {e.message}")
    except OSError as e:
        alloc.tell(TOOL, f"error: cannot listen on 127.0.0.1:{local} any more: {e.strerror or e}")
    else:
        return out
    alloc.relinquish(c, job_id, TOOL)
    return None


class Keeper:
    """`yard notebook`'s own connection to its job from its start: a terminal in rank 0 running
    `cat`, which reads the input it never gets. It makes the allocation "attached" for as long as
    this command runs (the plane's connection grace ends an allocation with nothing attached,
    control/loop/interactive.py: a notebook whose browser tab is closed is still in use while its
    `yard notebook` runs; this command's end, or its lost connection, starts the grace). Opening it
    counts as input once, nothing after (it sends nothing), so the idle timeout still sees an
    unused notebook; the plane's warnings to the job's terminals (an idle notebook about to end)
    arrive through it and are printed. Reopened when it drops; given up when refused (then only
    the browser's connections keep the allocation)."""

    RETRY_S = 2.0

    def __init__(self, job_id: int) -> None:
        from trainyard.cli import shell

        self.url = shell.ws_url(server_url(), job_id, None, None, ["cat"], 24, 80)
        self.tok = user_token()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[None] | None = None
        ready = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(ready,), name=f"notebook-keeper-{job_id}",
                                       daemon=True)
        self.thread.start()
        ready.wait(5)

    def _main(self, ready: threading.Event) -> None:
        async def main() -> None:
            self.loop, self.task = asyncio.get_running_loop(), asyncio.current_task()
            ready.set()
            await self._keep()
        try:
            asyncio.run(main())
        except asyncio.CancelledError:
            pass

    async def _keep(self) -> None:
        from trainyard.cli import shell

        while True:
            ws = await shell.connect(self.url, self.tok)
            if isinstance(ws, shell.Ended):
                if ws.how == "refused" and ws.status != 409:
                    alloc.tell(TOOL, f"warning: no terminal to keep the allocation attached ({ws.message}); "
                               "the plane's connection grace applies while no browser is connected")
                    return
                await asyncio.sleep(self.RETRY_S)
                continue
            async with ws:
                await ws.send(json.dumps({"pipe": True}))
                await self._say(ws)
            await asyncio.sleep(self.RETRY_S)

    async def _say(self, ws: Any) -> None:
        """The plane's lines to the job's terminals (`[yard] …`), on stderr, until the terminal ends."""
        from websockets.exceptions import ConnectionClosed

        try:
            async for msg in ws:
                if isinstance(msg, bytes):
                    for line in msg.decode(errors="replace").splitlines():
                        if line.strip():
                            alloc.tell(TOOL, line.strip())
        except ConnectionClosed:
            pass

    def stop(self) -> None:
        if self.loop is not None and self.task is not None and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self.task.cancel)
            except RuntimeError:
                pass
        self.thread.join(5)
