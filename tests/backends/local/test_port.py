"""`LocalBackend.open_port` (issue 38, `yard port-forward`): a TCP connection to a port inside a
running rank, made by a process of the owner's in the rank's place, handed to the plane (root).

A real owner account, real rank processes: each rank runs a small server (the system's python3,
which the owner may run) that answers one line with the uid /proc/net/tcp gives the connecting
socket, so the test sees who made the connection without trusting the plane's word.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.accounts import ROOT_ONLY, Accounts, accounts, shared_dir
from tests.backends.helpers import NODES, make_spec, marked_processes, wait_until
from trainyard.backends import BackendError, LocalBackend
from trainyard.backends.base import NothingListens, Owner

pytestmark = ROOT_ONLY

SYSTEM_PYTHON = "/usr/bin/python3"
# argv[1] the port; answers "uid=<the connecting socket's uid> rank=<RANK> got=<its line>"
SERVER = r'''
import os, socket, sys
port = int(sys.argv[1])
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen()
print("listening", flush=True)
while True:
    c, (_, peer) = srv.accept()
    line = c.makefile("rb").readline().decode().strip()
    uid = None
    for row in open("/proc/net/tcp").read().splitlines()[1:]:
        f = row.split()
        if int(f[1].split(":")[1], 16) == peer and int(f[2].split(":")[1], 16) == port:
            uid = int(f[7])
    c.sendall(f"uid={uid} rank={os.environ['RANK']} got={line}\n".encode())
    c.close()
'''


@pytest.fixture(scope="module")
def users() -> Iterator[Accounts]:
    with accounts({"alice": ["teama"]}, ["teama"]) as made:
        yield made


@pytest.fixture
def place() -> Iterator[Path]:
    with shared_dir("typort-") as d:
        (d / "server.py").write_text(SERVER)
        (d / "server.py").chmod(0o644)
        yield d


@pytest.fixture
def backend(place: Path) -> Iterator[LocalBackend]:
    data = place / "data"
    data.mkdir(mode=0o711)
    be = LocalBackend(data, NODES)
    yield be
    for a in be.poll():
        be.release(a.job_id, a.attempt)
    assert wait_until(lambda: marked_processes(data) == [], 10, "nothing of the jobs left")


def owner(users: Accounts) -> Owner:
    pw = pwd.getpwnam(users.user("alice"))
    return Owner(pw.pw_name, pw.pw_uid, pw.pw_gid, (pw.pw_gid, users.gid("teama")))


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def launch(backend: LocalBackend, place: Path, users: Accounts, job: int, command: list[str]) -> None:
    who = owner(users)
    work = place / f"work-{job}"
    work.mkdir(mode=0o700)
    os.chown(work, who.uid, who.gid)
    spec = make_spec(place / "data", job, command, ranks=((0, "node0", (0,)), (1, "node1", (0,))), workdir=work)
    backend.launch(replace(spec, owner=who))


def ask(fd: int, line: bytes) -> str:
    """`line` through the tunnel's socket, the answer read to its end; the fd closed."""
    with socket.socket(fileno=fd) as s:
        s.settimeout(10)
        s.sendall(line)
        out = b""
        while chunk := s.recv(4096):
            out += chunk
    return out.decode()


def listening(place: Path, job: int, rank: int) -> bool:
    log = place / "data" / "jobs" / str(job) / "logs" / f"rank-{rank}.log"
    return log.exists() and "listening" in log.read_text()


def test_the_connection_is_made_as_the_owner_in_the_ranks_place(backend, place, users):
    p0, p1 = free_ports(2)
    launch(backend, place, users, 1, ["sh", "-c", f'exec {SYSTEM_PYTHON} {place}/server.py $(( {p0} + ({p1} - {p0}) * $RANK ))'])
    wait_until(lambda: listening(place, 1, 0) and listening(place, 1, 1), 20, "both servers to listen")
    t = backend.open_port(1, 1, 1, p1)
    assert t.pid is None and t.read_fd == t.write_fd
    answer = ask(t.read_fd, b"hello\n")
    assert answer == f"uid={owner(users).uid} rank=1 got=hello\n", answer  # the owner's socket, not root's
    answer = ask(backend.open_port(1, 1, 0, p0).read_fd, b"again\n")
    assert answer == f"uid={owner(users).uid} rank=0 got=again\n", answer


def test_nothing_listening_an_unknown_rank_and_an_ended_one_are_refused(backend, place, users):
    [port] = free_ports(1)
    launch(backend, place, users, 2, ["sh", "-c", "[ $RANK = 1 ] && exec sleep 300; exit 0"])
    wait_until(lambda: not next(a for a in backend.poll() if a.job_id == 2).ranks[0].running, 10, "rank 0 to end")
    with pytest.raises(NothingListens, match=f"nothing listens on port {port} in job 2 rank 1"):
        backend.open_port(2, 1, 1, port)
    with pytest.raises(BackendError, match="job 2 attempt 1 rank 2: no such running rank"):
        backend.open_port(2, 1, 2, port)
    with pytest.raises(BackendError, match="job 2 attempt 1 rank 0: the rank is not running"):
        backend.open_port(2, 1, 0, port)


def test_a_rank_in_a_network_namespace_of_its_own_is_reached_there(backend, place, users):
    """`unshare -rn`: the owner's own user and network namespaces (its loopback brought up), as a
    container with a network of its own would have. The port is free on the host: only a
    connection made inside the rank's network reaches the server."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    probe = subprocess.run(["runuser", "-u", users.user("alice"), "--", "unshare", "-rn", "true"], capture_output=True)
    if unshare is None or ip is None or probe.returncode != 0:
        pytest.skip(f"no unprivileged network namespaces here: {probe.stderr.decode().strip()}")
    [port] = free_ports(1)
    launch(backend, place, users, 3, [unshare, "-rn", "sh", "-c", f"{ip} link set lo up && exec {SYSTEM_PYTHON} "
                                      f"{place}/server.py {port}"])
    wait_until(lambda: listening(place, 3, 0), 20, "the server to listen")
    with pytest.raises(ConnectionRefusedError):  # not on the host's loopback
        socket.create_connection(("127.0.0.1", port), 2).close()
    answer = ask(backend.open_port(3, 1, 0, port).read_fd, b"ns\n")
    assert answer == "uid=0 rank=0 got=ns\n", answer  # the owner is root inside its own user namespace
