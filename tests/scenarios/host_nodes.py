"""The two node names the end-to-end corpus tests give both backends: this machine's short host
name when it resolves (a rendezvous's head node must, as a real site's first node is a host), and
that name with `-2`, which nobody resolves. Slurm's node order (contracts.slurm_node_order) puts
the head first in every allocation on both backends; Slurm reads `NodeName=localhost` as the host."""

from __future__ import annotations

import socket


def _head_node() -> str | None:
    """This machine's short host name when it resolves, else None."""
    name = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(name)
    except OSError:
        return None
    return None if name == "localhost" else name


HEAD = _head_node()
NODES = (HEAD or "localhost", f"{HEAD or 'localhost'}-2")
