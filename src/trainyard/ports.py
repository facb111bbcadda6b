"""A port for a job's rank 0 to listen on (MASTER_PORT), chosen where nothing else takes ports.

The usual choice, `bind(0)` then close and hand the number over, draws from the kernel's
ephemeral range (`net.ipv4.ip_local_port_range`, 32768–60999 by default). Every outgoing TCP
connection on the machine draws its source port from that same range, so in the moment between
the check and rank 0's own bind another connection can take the port; rank 0 then dies with
EADDRINUSE in TCPStore (seen in CI with tests running side by side). Below the ephemeral range
only a program that names a port explicitly can take it, so a free port picked at random there
is far less likely to be gone a moment later.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20000  # below: ports that services commonly name (databases, web servers, 8080…)


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
            if _bindable(where, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((where, 0))
        return s.getsockname()[1]
