"""A port for a job's rank 0 to listen on (MASTER_PORT), chosen where nothing else takes ports.

The usual choice, `bind(0)` then close and hand the number over, draws from the kernel's
ephemeral range (`net.ipv4.ip_local_port_range`, 32768–60999 by default). Every outgoing TCP
connection on the machine draws its source port from that same range, so in the moment between
the check and rank 0's own bind another connection can take the port; rank 0 then dies with
EADDRINUSE in TCPStore (seen in CI with tests running side by side). Below the ephemeral range
only a program that names a port explicitly can take it, so a free port picked at random there
is far less likely to be gone a moment later.

The programs that do name ports there are mostly this one: several pickers at once (the control
plane's jobs, test workers side by side) can draw the same free port and both hand it over;
the second rank 0 to bind it dies with EADDRINUSE (seen once in 1,871 tests under load). So a
pick is also *leased*: a file named after the port, created exclusively in a directory of this
user's (`lease_dir`), which other pickers skip for `LEASE_S` seconds — long enough for rank 0 to
bind it (after which `_bindable` says no anyway), short enough that ports come back.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20000  # below: ports that services commonly name (databases, web servers, 8080…)
LEASE_S = 300.0  # a picked port is skipped by other pickers this long


def lease_dir() -> Path:
    """This user's lease directory (0700), in the temporary directory."""
    d = Path(tempfile.gettempdir()) / f"trainyard-ports-{os.getuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    return d


def _lease(port: int, now: float | None = None) -> bool:
    """Take the lease on `port`: False when another pick holds a fresh one. A stale lease (older
    than LEASE_S) is taken over; a lease directory that cannot be used leases nothing (True)."""
    now = time.time() if now is None else now
    try:
        d = lease_dir()
        path = d / str(port)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            try:
                if now - path.stat().st_mtime < LEASE_S:
                    return False
                os.utime(path, (now, now))  # stale: ours now
                return True
            except FileNotFoundError:
                return _lease(port, now)
        os.close(fd)
        return True
    except OSError:
        return True


def ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in EPHEMERAL_RANGE.read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(addr: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, port))
        except OSError:
            return False
        return True


def free_port(addr: str = "127.0.0.1", tries: int = 64, rng: random.Random | None = None) -> int:
    """A TCP port free right now on `addr` (on every address when `addr` is not this host's: the
    local backend's MASTER_ADDR may be a node name), below the ephemeral range when one is free
    there, else one from `bind(0)`."""
    where = addr if _bindable(addr, 0) else ""
    lo, _ = ephemeral_range()
    rng = rng or random.SystemRandom()
    if lo - 1 > LOWEST:
        for _ in range(tries):
            port = rng.randint(LOWEST, lo - 1)
            if _bindable(where, port) and _lease(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((where, 0))
        return s.getsockname()[1]
