"""A fake plane served by a real uvicorn on loopback, with jobs to open terminals in (`yard shell`).

The fake backend's ranks are scripted, but its `open_terminal` is a real pseudo-terminal running
the command as the plane's user (backends/fake.py), so everything from the WebSocket handshake to
the pty's bytes is real; only the rank it joins is not. Time stands still (no loop thread), so a
RUNNING job stays RUNNING while the test types.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from tests.fake_plane import FakePlane, fake


@dataclass
class Served:
    p: FakePlane
    url: str  # http://127.0.0.1:PORT
    running: int  # alice's 2-rank job (team vision), RUNNING
    pending: int  # alice's job that cannot start (held)
    alice: str  # its owner's member token
    bob: str  # another member of the same team
    nora: str  # a member of team nlp
    operator: str
    viewer: str
    job_token: str  # a job token of `running`

    def events(self) -> list[dict]:
        return [e for e in self.p.events(self.running) if e["kind"] == "job.attach"]


def serve(data_dir: Path) -> tuple[Served, uvicorn.Server, threading.Thread]:
    p = FakePlane(data_dir)
    alice = p.token("alice", "member", "vision")
    c = p.client(alice)
    running = p.submit(c, command=fake("run=100000"), gpus=2, team="vision", env={"MARK": "x42"})["id"]
    p.wait(running, "RUNNING")
    pending = p.submit(c, command=fake("run=10"), gpus=1, team="vision", hold=True)["id"]
    job_token = p.backend.cluster.attempts[(running, p.job(running)["attempt"])].ranks[0].env["TRAINYARD_TOKEN"]
    config = uvicorn.Config(p.app, host="127.0.0.1", port=0, log_level="warning", ws="websockets-sansio")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    return (Served(p, f"http://127.0.0.1:{port}", running, pending, alice, p.token("bob", "member", "vision"),
                   p.token("nora", "member", "nlp"), p.token("olga", "operator"), p.token("vera", "viewer"),
                   job_token), server, thread)


def stop(served: Served, server: uvicorn.Server, thread: threading.Thread) -> None:
    server.should_exit = True
    thread.join(10)
    served.p.stop()
