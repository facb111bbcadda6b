"""Each rank's cell is named after its emulated node (backends/contain/private_tmp.py, the rank
runner): its own UTS namespace with the node's name, and an /etc/hosts in its mount namespace that
maps every emulated node to 127.0.0.1 — so `hostname` in rank 1 says node1, a rank resolves its own
and its peers' names (gloo does), and a terminal in the rank (`yard shell`) sees the same name.
Real processes, a root plane, tmpfs mode; the host's own name and /etc/hosts stay as they were.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.accounts import ROOT_ONLY, shared_dir
from tests.backends.helpers import NODES, make_spec, marked_processes, wait_done, wait_until
from tests.backends.terminal_io import Screen
from trainyard.backends import LocalBackend

pytestmark = ROOT_ONLY

PROBE = ["python3", "-I", "-S", "-c",
         "import os, socket; r = os.environ['RANK']; "
         "print(f'R{r} H=' + socket.gethostname() + ' ' + ' '.join(n + '=' + socket.gethostbyname(n) "
         "for n in ('node0', 'node1')), flush=True); import time; time.sleep(300)"]


@pytest.fixture
def backend() -> Iterator[tuple[LocalBackend, Path]]:
    with shared_dir("tynames-") as d:
        data = d / "data"
        data.mkdir(mode=0o711)
        be = LocalBackend(data, NODES, private_tmp_mode="tmpfs")
        yield be, d
        for a in be.poll():
            be.release(a.job_id, a.attempt)
        assert wait_until(lambda: marked_processes(data) == [], 10, "nothing of the jobs left")


def _log(d: Path, job: int, rank: int) -> str:
    return (d / "data" / "jobs" / str(job) / "logs" / f"rank-{rank}.log").read_text()


def test_each_rank_is_named_after_its_node_and_resolves_every_node(backend) -> None:
    be, d = backend
    host, hosts = socket.gethostname(), Path("/etc/hosts").read_bytes()
    spec = make_spec(d / "data", 1, PROBE, ranks=((0, "node0", (0,)), (1, "node1", (0,))), workdir=d)
    be.launch(spec)
    for rank, node in ((0, "node0"), (1, "node1")):
        wait_until(lambda: f"R{rank} " in _log(d, 1, rank), 20, f"rank {rank}'s line")
        assert f"R{rank} H={node} node0=127.0.0.1 node1=127.0.0.1" in _log(d, 1, rank), _log(d, 1, rank)
    screen = Screen(be.open_terminal(1, 1, 1, ["sh", "-c", "echo name=$(hostname)."], rows=24, cols=80))
    try:
        screen.finish()
    finally:
        screen.close()
    assert "name=node1." in screen.seen, screen.seen
    assert (socket.gethostname(), Path("/etc/hosts").read_bytes()) == (host, hosts)  # the host's untouched
    be.signal(1, 1, 9)
    wait_done(be, 1, 1)


def test_dir_mode_leaves_the_hosts_name(tmp_path) -> None:
    with shared_dir("tynames-") as d:
        data = d / "data"
        data.mkdir(mode=0o711)
        be = LocalBackend(data, NODES, private_tmp_mode="dir")
        try:
            be.launch(make_spec(data, 2, ["sh", "-c", "echo H=$(hostname)."], workdir=d))
            wait_done(be, 2, 1)
            assert f"H={socket.gethostname()}." in (data / "jobs" / "2" / "logs" / "rank-0.log").read_text()
        finally:
            for a in be.poll():
                be.release(a.job_id, a.attempt)


