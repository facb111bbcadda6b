"""`yard port-forward JOB LOCAL:REMOTE`: who may connect to a port inside a running job, in which rank.

The WebSocket route (`api/routers/ports.py`) parses its path and query here (`parse_ask`), then
`open_port` checks the caller (`terminals.check_attach`: the job's owner and admins, operators
where the configuration lets them; never a job token), the job's state and the rank, asks the
plane for the connection (`Plane.open_port`: made as the owner, inside the rank's network) and
records it in the audit trail; `api/port_pump.py` then carries its bytes.

The audit event `job.port_forward` (user, role, rank, node, port) is written for a user's first
connection to that job's rank and port, and again once `AUDIT_EVERY_S` have passed since the last
one: a browser on a forwarded JupyterLab opens dozens of connections a minute, and the trail is to
say who reached which port of whose job and when, not to count a page's requests.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.backends.base import Tunnel
from trainyard.services import events, terminals
from trainyard.services.auth import Principal
from trainyard.services.errors import Conflict, ServiceError
from trainyard.services.plane_facade import Plane
from trainyard.services.ranks import ranks_for
from trainyard.states import JobState
from trainyard.store.models import EventRow

AUDIT_EVERY_S = 600.0
EVENT = "job.port_forward"


@dataclass(frozen=True)
class PortAsk:
    """The port inside the job, and a rank or a node (neither: rank 0)."""

    port: int
    rank: int | None = None
    node: str | None = None


def parse_port(text: str) -> int:
    """The path's port: 1..65535."""
    try:
        port = int(text)
    except ValueError:
        raise ServiceError(f"port: not a port number: {text[:40]!r}", field="port") from None
    if not 1 <= port <= 65535:
        raise ServiceError(f"port: {port} is out of range (1..65535)", field="port")
    return port


def parse_ask(port_text: str, items: Iterable[tuple[str, str]]) -> PortAsk:
    """The path's port and the query (`rank` or `node`) checked.

    Raises:
        ServiceError: a bad port, an unknown, repeated or bad parameter, named.
    """
    one: dict[str, str] = {}
    for name, value in items:
        if name not in ("rank", "node"):
            raise ServiceError(f"unknown parameter {name!r} (rank, node)", field=name)
        if name in one:
            raise ServiceError(f"{name}: given twice", field=name)
        if "\x00" in value:
            raise ServiceError(f"{name}: text must not contain NUL (%00)", field=name)
        one[name] = value
    if "rank" in one and "node" in one:
        raise ServiceError("give rank or node, not both", field="node")
    rank = None
    if "rank" in one:
        try:
            rank = int(one["rank"])
        except ValueError:
            raise ServiceError(f"rank: not an integer: {one['rank'][:40]!r}", field="rank") from None
        if not 0 <= rank <= 2**31 - 1:
            raise ServiceError(f"rank: {rank} is out of range (0..{2**31 - 1})", field="rank")
    return PortAsk(parse_port(port_text), rank, one.get("node") or None)


def open_port(plane: Plane, by: Principal, job_id: int, ask: PortAsk) -> tuple[Tunnel, int, str]:
    """The checked connection, its rank and node, audited. Blocking: call it on a worker thread.

    Raises:
        NotFound: no such job. Forbidden: not the owner, an admin, nor an operator where operators
        may; a job token. Conflict: the job is not RUNNING, or its rank is not running on the
        backend. BadGateway: nothing listens on the port there. ServiceError: no such rank or node.
    """
    with plane.store.session() as s:
        row = terminals.check_attach(s, plane, by, job_id, "forward a port")
        if row.state != JobState.RUNNING:
            raise Conflict(f"job {job_id} is {row.state}, not RUNNING: no port to forward")
        ranks = ranks_for(row.placement or [], row.tasks_per_node)
        rank, node = terminals.rank_of(job_id, ranks, terminals.TerminalAsk(rank=ask.rank, node=ask.node))
    tunnel = plane.open_port(job_id, rank, ask.port)
    try:
        with plane.transaction() as s:
            if not _audited_lately(s, by.user, job_id, rank, ask.port):
                events.record(s, by.user, EVENT, f"{by.user} forwarded port {ask.port} of rank {rank} on {node}",
                              job_id=job_id, node=node,
                              data={"user": by.user, "role": by.role, "rank": rank, "node": node, "port": ask.port})
    except BaseException:
        discard(tunnel)  # no connection that the audit trail does not show
        raise
    return tunnel, rank, node


def _audited_lately(s: Session, user: str, job_id: int, rank: int, port: int) -> bool:
    since = time.time() - AUDIT_EVERY_S  # events are stamped with the wall clock (services/events.py)
    rows = s.scalars(select(EventRow.data).where(EventRow.job_id == job_id, EventRow.kind == EVENT,
                                                 EventRow.actor == user, EventRow.time >= since)).all()
    return any(isinstance(d, dict) and d.get("rank") == rank and d.get("port") == port for d in rows)


def discard(tunnel: Tunnel) -> None:
    """A connection opened but not to be served: its fds closed, its helper (if any) ended and reaped."""
    for fd in {tunnel.read_fd, tunnel.write_fd}:
        try:
            os.close(fd)
        except OSError:
            pass
    if tunnel.pid is not None:
        end_helper(tunnel.pid, grace_s=0.0)


def end_helper(pid: int, grace_s: float) -> None:
    """A tunnel's helper (the leader of its own process group): SIGTERM to its group, SIGKILL after
    `grace_s`, reaped. Blocking: call it on a worker thread."""
    _kill_group(pid, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        time.sleep(0.05)
    _kill_group(pid, signal.SIGKILL)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
