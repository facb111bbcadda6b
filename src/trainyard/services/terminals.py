"""`yard shell JOB`: who may open a terminal in a running job, in which rank, with what command.

The WebSocket route (`api/routers/terminal.py`) parses its query here (`parse_ask`), then
`open_terminal` checks the caller, the job's state and the rank, asks the plane for the process
(`Plane.open_terminal`) and records the attach in the audit trail (`job.attach`: who, rank, node,
command), or kills the process when it cannot; `api/terminal.py` then carries its bytes.

`session=1` (`yard alloc`, `yard srun --pty`): the terminal is an interactive allocation's session.
It opens in rank 0 (the first node: where the allocation's hold runs, with the whole allocation's
environment); refused (400, `session`) for a job that is not interactive. When its process exits,
`session_ended` stores the code and ends the allocation (services/allocations.py); a client that
goes away ends nothing (the connection grace does: control/loop/interactive.py).

Who may: the job's owner (a member token of the job's team whose user is the job's) and admins.
Operators, viewers, other members of the team, other teams and job tokens may not (403), and
are refused before anything starts: a terminal runs as the job's owner, so it is theirs alone.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Iterable

from sqlalchemy.orm import Session

from trainyard.backends.base import Terminal
from trainyard.contracts import RankPlacement
from trainyard.services import allocations, events, jobs
from trainyard.services.auth import Principal
from trainyard.services.errors import Conflict, Forbidden, ServiceError
from trainyard.services.plane_facade import Plane
from trainyard.services.ranks import ranks_for
from trainyard.states import JobState
from trainyard.store.models import JobRow

DEFAULT_ARGV: tuple[str, ...] = ()  # none: the backend starts the owner's shell (the rank's $SHELL)
MAX_ARGS, MAX_ARG_CHARS, MAX_SIDE = 256, 4096, 1000


@dataclass(frozen=True)
class TerminalAsk:
    """What the client asked for: a rank or a node (neither: rank 0), the command, the size,
    whether it is the allocation's session."""

    rank: int | None = None
    node: str | None = None
    argv: tuple[str, ...] = DEFAULT_ARGV
    rows: int = 24
    cols: int = 80
    session: bool = False


def _int(name: str, text: str, low: int, high: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise ServiceError(f"{name}: not an integer: {text[:40]!r}", field=name) from None
    if not low <= v <= high:
        raise ServiceError(f"{name}: {v} is out of range ({low}..{high})", field=name)
    return v


def parse_job_id(text: str) -> int:
    """The path's job id (an id the store can compare with)."""
    return _int("job_id", text, 1, 2**31 - 1)


def parse_ask(items: Iterable[tuple[str, str]]) -> TerminalAsk:
    """The route's query (`rank` or `node`, `cmd` repeated for argv, `rows`, `cols`, `session`) checked.

    Raises:
        ServiceError: an unknown, repeated or bad parameter, named.
    """
    one: dict[str, str] = {}
    argv: list[str] = []
    for name, value in items:
        if "\x00" in value:
            raise ServiceError(f"{name}: text must not contain NUL (%00)", field=name)
        if name == "cmd":
            if len(argv) >= MAX_ARGS or len(value) > MAX_ARG_CHARS:
                raise ServiceError(f"cmd: at most {MAX_ARGS} arguments of {MAX_ARG_CHARS} characters", field="cmd")
            argv.append(value)
        elif name not in ("rank", "node", "rows", "cols", "session"):
            raise ServiceError(f"unknown parameter {name!r} (rank, node, cmd, rows, cols, session)", field=name)
        elif name in one:
            raise ServiceError(f"{name}: given twice", field=name)
        else:
            one[name] = value
    if "rank" in one and "node" in one:
        raise ServiceError("give rank or node, not both", field="node")
    if argv and not argv[0]:
        raise ServiceError("cmd: the command is empty", field="cmd")
    rank = _int("rank", one["rank"], 0, 2**31 - 1) if "rank" in one else None
    session = _flag("session", one.get("session", "0"))
    if session and (one.get("node") or rank):
        raise ServiceError("session: an allocation's session opens in rank 0 (its first node); give no rank or node",
                           field="session")
    return TerminalAsk(rank=rank, node=one.get("node") or None, argv=tuple(argv) or DEFAULT_ARGV,
                       rows=_int("rows", one.get("rows", "24"), 1, MAX_SIDE),
                       cols=_int("cols", one.get("cols", "80"), 1, MAX_SIDE), session=session)


def _flag(name: str, text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no", ""):
        return False
    raise ServiceError(f"{name}: give 1 or 0, not {text[:40]!r}", field=name)


def may_attach(by: Principal, owner: str, team: str, *, operators: bool = False) -> bool:
    """Admins, the job's owner through a member token of its team, and operators where the
    configuration lets them (`interactive.operators_may_attach`)."""
    return by.is_admin or (operators and by.role == "operator") or \
        (by.role == "member" and by.team == team and by.user == owner)


def check_attach(s: Session, plane: Plane, by: Principal, job_id: int, what: str) -> JobRow:
    """The job `by` may attach to (a terminal, a forwarded port: `what` says which, for the message).

    Raises:
        NotFound: no such job (or one `by` may not see). Forbidden: a job token, or not the owner,
        an admin, nor an operator where operators may.
    """
    row = jobs.get(s, job_id, by)
    if by.role == "job":
        raise Forbidden(f"a job token cannot {what}")
    operators = plane.configs.current(s).spec.interactive.operators_may_attach
    if not may_attach(by, row.user, row.team, operators=operators):
        who = "its owner {!r} and admins".format(row.user) + (" and operators" if operators else "")
        raise Forbidden(f"a {by.role} token of {by.user!r} cannot {what} in job {job_id} (only {who} may)")
    return row


def open_terminal(plane: Plane, by: Principal, job_id: int, ask: TerminalAsk) -> tuple[Terminal, int, str]:
    """The checked terminal, its rank and node, the attach recorded. Blocking: call it on a worker thread.

    Raises:
        NotFound: no such job. Forbidden: not the owner nor an admin. Conflict: the job is not
        RUNNING, or its rank is not running on the backend. ServiceError: no such rank or node.
    """
    with plane.store.session() as s:
        row = check_attach(s, plane, by, job_id, "open a terminal")
        if ask.session and row.interactive is None:
            raise ServiceError(f"session: job {job_id} is not an interactive allocation (a session is "
                               "`yard alloc`'s; `yard shell` opens a terminal in any running job)", field="session")
        if row.state != JobState.RUNNING:
            raise Conflict(f"job {job_id} is {row.state}, not RUNNING: no terminal to open")
        rank, node = rank_of(job_id, ranks_for(row.placement or [], row.tasks_per_node), ask)
    term = plane.open_terminal(job_id, rank, list(ask.argv), ask.rows, ask.cols, session=ask.session)
    try:
        with plane.transaction() as s:
            what = "the allocation's session" if ask.session else "a terminal"
            events.record(s, by.user, "job.attach", f"{by.user} opened {what} in rank {rank} on {node}: "
                          f"{' '.join(ask.argv)[:200] or 'a shell'}", job_id=job_id, node=node,
                          data={"user": by.user, "role": by.role, "rank": rank, "node": node, "argv": list(ask.argv),
                                "session": ask.session})
    except BaseException:
        discard(term)  # no terminal that the audit trail does not show
        raise
    return term, rank, node


def session_ended(plane: Plane, by: Principal, job_id: int, code: int) -> None:
    """An allocation's session process exited with `code` (`api/terminal.py`'s pump): the
    allocation ends with it (`allocations.end_session`), the loop woken at once."""
    with plane.transaction() as s:
        stop = allocations.end_session(s, job_id, code, plane.clock(), actor=by.user)
    if stop:
        plane.wake()


def rank_of(job_id: int, ranks: list[RankPlacement], ask: TerminalAsk) -> tuple[int, str]:
    """The rank and node `ask` names (a node: its first rank there; neither: rank 0), for terminals
    and forwarded ports alike. Raises ServiceError naming `node` or `rank` when the job has none."""
    if ask.node is not None:
        rank = next((r.rank for r in ranks if r.node == ask.node), None)
        if rank is None:
            raise ServiceError(f"node: job {job_id} runs no rank on {ask.node!r} "
                               f"(its nodes: {sorted({r.node for r in ranks})})", field="node")
        return rank, ask.node
    rank = ask.rank or 0
    if rank >= len(ranks):
        raise ServiceError(f"rank: job {job_id} has ranks 0..{len(ranks) - 1}, not {rank}", field="rank")
    return rank, ranks[rank].node


def discard(term: Terminal) -> None:
    """A terminal opened but not to be served: its process group (never the plane's) and it
    killed, reaped, its fd closed."""
    try:
        group = os.getpgid(term.pid)
        if group != os.getpgrp():
            os.killpg(group, signal.SIGKILL)
        os.kill(term.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.waitpid(term.pid, 0)
    except ChildProcessError:
        pass
    os.close(term.fd)


def exit_code(status: int) -> int:
    """A wait status as a shell reports it: the exit code, or 128 + the signal that ended it."""
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code
