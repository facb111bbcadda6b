"""The rank processes of a benchmark that trains on several ranks: one process per rank with the
job-environment variables of docs/design.md (as trainyard's local backend starts them), on a free
loopback port, one thread each, without the caller's TRAINYARD_ variables (no plane)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def launch(script: str, nproc: int, args: list[str]) -> int:
    """Run `script --rank-process *args` as `nproc` ranks; the highest exit code."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(nproc):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
        env.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, script, "--rank-process", *args], env=env))
    return max(p.wait() for p in procs)
