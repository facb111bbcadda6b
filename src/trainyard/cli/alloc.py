"""`yard alloc [options] [-- CMD ARGS…]`: an interactive allocation, as Slurm's `salloc` with
`use_interactive_step` (issue 38).

It takes `yard submit`'s options but the batch-only ones (`jobs.job_request`, via
cli/shared_options.py: one declaration, one check, exit 2 naming the option), submits a job with
`interactive: {"kind": "alloc"}` and no command (the plane's hold script keeps the nodes:
services/allocations.py) in the interactive class unless `-q` names another, and then:

1. waits, as salloc does: `salloc: Pending job allocation N`, then one status line on stderr,
   redrawn in place while stderr is a terminal (state, reason, estimated start, time waited), a
   plain line for each change when it is not; `salloc: Granted job allocation N` and
   `salloc: Nodes … are ready for job` once it runs. Ctrl-C, SIGTERM or SIGHUP meanwhile cancels it
   (`Job allocation N has been revoked.`, exit 1); a job that ends before it runs is reported with
   its state and reason (exit 1).
2. opens the allocation's session: a terminal through the API (cli/shell.py, `session=1`) on its
   first node, in the job's containment, as its owner, with the whole allocation's environment;
   the user's shell, or CMD. Its exit ends the allocation (the plane's doing: COMPLETED for 0,
   FAILED otherwise) and `yard alloc` exits with its code, after `Relinquishing job allocation N`.
   SIGTERM/SIGHUP here releases the allocation; a lost connection leaves it to the plane's
   connection grace (a `yard shell N` in time keeps it).

The messages start `salloc:` (`srun:` for `yard srun --pty`, cli/srun_cmd.py) and use salloc's
words: they are the ones people and wrappers already look for ("Granted job allocation"), and they
tell the allocation's own lines from the remote shell's output; errors are `salloc: error: …`.
`wait_for_start` and `run_session` serve `yard notebook` too.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from types import FrameType
from typing import Any, Callable

import typer

from trainyard.cli import jobs, shell
from trainyard.cli.client import Client, error_message, server_url, token
from trainyard.cli.http import TransportError
from trainyard.cli.render import clock, duration, nodelist
from trainyard.cli.safe_text import clean
from trainyard.cli.shared_options import with_options
from trainyard.states import PENDING_STATES

EXIT_FAILED = 1  # salloc's status when it gets no allocation or loses it
# `yard submit`'s options that make no sense for an allocation (salloc has none of them), and the
# value each takes instead (nothing asked).
BATCH_ONLY: dict[str, Any] = {"output": None, "error": None, "open_mode_": None, "array": None, "wrap": None,
                              "recipe": None, "sets": [], "_requeue": False, "checkpoint_interval": None}
NOT_OPTIONS = ("args", "after_dashdash", "interactive")
POLL_S = (0.1, 0.1, 0.2, 0.2, 0.3, 0.5)  # then every second: an idle cluster's start is seen at once
OPEN_S = 15.0  # how long a RUNNING job's session may answer "not running yet" (its rank starting)


class Stop(Exception):
    """A signal (Ctrl-C, SIGTERM, SIGHUP) while the allocation is asked for or waited on."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@with_options(jobs.job_request, drop=(*NOT_OPTIONS, *BATCH_ONLY))
def alloc(ctx: typer.Context, **options: Any) -> None:
    """An interactive allocation, as salloc: waits for it (state, reason, estimated start), then your
    shell (or the command after `--`) on its first node, in the job, as you, with its environment
    (SLURM_JOB_ID, SLURM_JOB_NODELIST, CUDA_VISIBLE_DEVICES; `srun` spreads tasks over its nodes).
    Leaving the shell ends the allocation; exits with the shell's status."""
    raise typer.Exit(allocate("alloc", list(ctx.args), options, tool="salloc"))


def allocate(kind: str, cmd: list[str], options: dict[str, Any], tool: str) -> int:
    """Ask, wait, run the session, end: the exit status (see the module docstring)."""
    body, where = request(kind, options)  # bad options: exit 2 before anything is sent
    c, job_id = Client(), None
    with stops_raise():
        try:
            job_id = submit(c, body, where, tool)
            tell(tool, f"Pending job allocation {job_id}")
            job = wait_for_start(c, job_id, tool)
        except Stop:
            if job_id is None:  # before the plane answered: whether it made the job is not known
                tell(tool, "error: interrupted while the allocation was being asked for (see yard queue --me)")
            else:
                revoke(c, job_id, tool)
            return EXIT_FAILED
    if job is None:
        return EXIT_FAILED
    return run_session(c, job_id, cmd, tool)


def request(kind: str, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The allocation's job as `POST /api/v1/jobs` takes it (`interactive.kind` = `kind`), from
    `yard alloc`'s options (`yard submit`'s but `BATCH_ONLY`); a bad one: exit 2 naming it."""
    return jobs.job_request([], False, {"kind": kind}, **options, **BATCH_ONLY)


def submit(c: Client, body: dict[str, Any], where: dict[str, str], tool: str) -> int:
    """Submit the allocation's job: its id. Refused: exit 2 with the API's reason (as yard submit)."""
    job = c.post("/api/v1/jobs", json=body, where=where)
    for w in job.pop("warnings", None) or ():
        tell(tool, f"warning: {w}")
    return int(job["id"])


def tell(tool: str, text: str) -> None:
    typer.echo(f"{tool}: {clean(text)}", err=True)


class stops_raise:
    """Within it, SIGINT, SIGTERM and SIGHUP raise `Stop` (the default handlers back after)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __enter__(self) -> None:
        def raise_stop(signum: int, _frame: FrameType | None) -> None:
            raise Stop(signum)

        self.saved = {s: signal.signal(s, raise_stop) for s in self.SIGNALS}

    def __exit__(self, *exc: object) -> None:
        for s, h in self.saved.items():
            signal.signal(s, h)


def wait_for_start(c: Client, job_id: int, tool: str, *, now: Callable[[], float] = time.time) -> dict | None:
    """Poll the job until it runs: its view then; None (reported, with its state and reason) when
    it ended first. Shows the wait on stderr (see the module docstring). Raises `Stop` from a
    signal when the caller lets them (`stops_raise`)."""
    line = StatusLine(tool, job_id, sys.stderr.isatty())
    started, polls, granted = now(), 0, False
    try:
        while True:
            job = c.get(f"/api/v1/jobs/{job_id}")
            state = job["state"]
            if state in ("CONFIGURING", "RUNNING") and not granted:
                line.done()
                tell(tool, f"Granted job allocation {job_id}")
                granted = True
                if state == "CONFIGURING":
                    tell(tool, "Waiting for resource configuration")
            if state == "RUNNING":
                line.done()
                tell(tool, f"Nodes {nodelist(job.get('placement')) or '?'} are ready for job")
                return job
            if state not in (*PENDING_STATES, "CONFIGURING"):
                line.done()
                why = f" ({job['reason']})" if job.get("reason") not in (None, "", "None") else ""
                tell(tool, f"error: Job allocation {job_id} ended before its session began: {state}{why}")
                return None
            line.show(job, now() - started)
            time.sleep(POLL_S[polls] if polls < len(POLL_S) else 1.0)
            polls += 1
    finally:
        line.done()


class StatusLine:
    """The waiting allocation's one line: redrawn in place on a terminal, a new line per change when
    not (a log or a pipe gets no carriage returns)."""

    def __init__(self, tool: str, job_id: int, live: bool):
        self.tool, self.job_id, self.live = tool, job_id, live
        self.drawn = False
        self.last: tuple[Any, ...] | None = None

    def show(self, job: dict, waited: float) -> None:
        reason = job.get("reason") if job.get("reason") not in (None, "", "None") else None
        est = job.get("est_start")
        text = f"{self.tool}: job {self.job_id} {job['state']}" + (f" ({reason})" if reason else "")
        if est is not None:
            text += f", estimated start {clock(est)}" + (f" (in {duration(est - time.time())})"
                                                          if est > time.time() else "")
        if self.live:
            sys.stderr.write(f"\r\x1b[K{clean(text)}, waiting {duration(waited)}")
            sys.stderr.flush()
            self.drawn = True
            return
        key = (job["state"], reason, None if est is None else round(est / 60))  # a new estimate: by the minute
        if key != self.last:
            self.last = key
            typer.echo(clean(text), err=True)

    def done(self) -> None:
        if self.drawn:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.drawn = False


def revoke(c: Client, job_id: int, tool: str) -> None:
    """Cancel the allocation (as `yard cancel`), as salloc does when interrupted while it waits."""
    try:
        r = c.http.request("POST", f"/api/v1/jobs/{job_id}/cancel")
    except TransportError as e:
        tell(tool, f"error: could not cancel job {job_id} ({type(e).__name__}): cancel it with yard cancel {job_id}")
        return
    if r.status_code >= 400:
        tell(tool, f"error: cancelling job {job_id}: {error_message(r)}")
    tell(tool, f"Job allocation {job_id} has been revoked.")


def relinquish(c: Client, job_id: int, tool: str) -> None:
    """End a running allocation now, as its session exiting 0 would (`POST …/release`, H1a's)."""
    tell(tool, f"Relinquishing job allocation {job_id}")
    try:
        r = c.http.request("POST", f"/api/v1/jobs/{job_id}/release")
    except TransportError as e:  # the plane may be the thing that went away
        tell(tool, f"error: could not release job {job_id} ({type(e).__name__}); it ends after the connection grace")
        return
    if r.status_code >= 400 and r.status_code != 409:  # 409: it is ending already
        tell(tool, f"error: releasing job {job_id}: {error_message(r)}")


def run_session(c: Client, job_id: int, cmd: list[str], tool: str) -> int:
    """The allocation's session terminal, until it ends; the exit status for the command."""
    url = shell.ws_url(server_url(), job_id, None, None, cmd, *shell.size(), session=True)
    try:
        ended = asyncio.run(_session(url, token(), sys.stdin.isatty()))
    except KeyboardInterrupt:  # Ctrl-C with stdin not a terminal (raw mode sends it as a byte)
        ended = shell.Ended(128 + signal.SIGINT, "signal")
    if ended.how == "exit":
        tell(tool, f"Relinquishing job allocation {job_id}")
        settle(c, job_id)
        return ended.code
    if ended.how == "lost":
        tell(tool, f"error: the connection to job allocation {job_id} was lost; it ends after the plane's "
                   f"connection grace unless you attach again in time (yard shell {job_id})")
        return EXIT_FAILED
    if ended.how == "opening":
        revoke(c, job_id, tool)
        return EXIT_FAILED
    if ended.how != "signal":  # refused or unreachable: the allocation is no use without its session
        tell(tool, f"error: {ended.message}")
    relinquish(c, job_id, tool)
    return ended.code


async def _session(url: str, tok: str | None, is_tty: bool) -> shell.Ended:
    """Connect (again while the plane says the job's rank is not running yet, up to OPEN_S), then
    carry the session. A signal while connecting: `Ended(how="opening")`."""
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    for s in signals:
        loop.add_signal_handler(s, lambda: me.cancel() if me is not None else None)
    try:
        deadline = loop.time() + OPEN_S
        while True:
            ws = await shell.connect(url, tok)
            if not (isinstance(ws, shell.Ended) and ws.status == 409 and loop.time() < deadline):
                break
            await asyncio.sleep(0.2)
    except asyncio.CancelledError:
        return shell.Ended(EXIT_FAILED, "opening")
    finally:
        for s in signals:
            loop.remove_signal_handler(s)
    if isinstance(ws, shell.Ended):
        return ws
    async with ws:
        return await shell.Session(ws, is_tty).run()


def settle(c: Client, job_id: int, within: float = 5.0) -> None:
    """Wait (a little) until the plane has ended the allocation, as salloc returns once its
    allocation is released: a `yard alloc` right after finds the GPUs free."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            r = c.http.request("GET", f"/api/v1/jobs/{job_id}")
        except TransportError:
            return
        if r.status_code != 200 or r.json().get("state") not in ("CONFIGURING", "RUNNING", "COMPLETING"):
            return
        time.sleep(0.1)
