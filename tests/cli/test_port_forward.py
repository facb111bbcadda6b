"""`yard port-forward` against a real root `yard up` on the local backend (issue 38): a local port
reaches an HTTP server started in a job, through the API, the connection made as the job's owner.

Real Unix accounts (tests/accounts.py: alice in team vision, bob in nlp), a real `yard up` run by
root that runs jobs as their owners, a job of alice's running the system's python3 as an HTTP
server. The server answers each request with the uid that /proc/net/tcp gives the socket that
connected to it: the owner's, never root's, though the plane that forwards is root.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.accounts import ROOT_ONLY, Accounts, shared_dir
from tests.plane import YARD, YardServer
from tests.security.hostile import config_text, two_accounts
from trainyard.cli.port_forward import Refused, forward

pytestmark = [ROOT_ONLY, pytest.mark.xdist_group("port-forward-yard-up")]

# argv[1] the port; GET answers "uid=<the connecting socket's uid> rank=<RANK> path=<path>"
SERVER = r'''
import http.server, os, sys
port = int(sys.argv[1])

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        peer, uid = self.client_address[1], None
        for row in open("/proc/net/tcp").read().splitlines()[1:]:
            f = row.split()
            if int(f[1].split(":")[1], 16) == peer and int(f[2].split(":")[1], 16) == port:
                uid = int(f[7])
        body = f"uid={uid} rank={os.environ['RANK']} path={self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass

print("listening", flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@dataclass
class Site:
    server: YardServer
    acc: Accounts
    alice: str  # alice's member token (team vision)
    bob: str  # bob's (team nlp)
    job: int  # alice's job, its HTTP server on `port`
    port: int

    def env(self, tok: str) -> dict[str, str]:
        return {**os.environ, "YARD_URL": self.server.url, "YARD_TOKEN": tok}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    with two_accounts() as acc, shared_dir("typf-") as base:
        os.chmod(base, 0o755)
        cfg = base / "cluster.yaml"
        cfg.write_text(config_text(acc))
        (base / "server.py").write_text(SERVER)
        (base / "server.py").chmod(0o644)
        home = base / "home-alice"
        home.mkdir()
        os.chown(home, acc.uid("alice"), acc.gid("vis"))
        (base / "yard").mkdir()
        server = YardServer(base / "yard", config_file=cfg, identity=False)
        admin = server.start()
        try:
            alice = admin.post("/api/v1/tokens", json={"user": "alice", "role": "member", "team": "vision"}).json()["token"]
            bob = admin.post("/api/v1/tokens", json={"user": "bob", "role": "member", "team": "nlp"}).json()["token"]
            port = free_port()
            c = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {alice}"}, timeout=10)
            r = c.post("/api/v1/jobs", json={"command": ["/usr/bin/python3", str(base / "server.py"), str(port)],
                                             "team": "vision", "gpus": 1, "workdir": str(home)})
            assert r.status_code == 201, r.text
            job = r.json()["id"]
            deadline = time.monotonic() + 60
            while "listening" not in c.get(f"/api/v1/jobs/{job}/logs").text:
                assert time.monotonic() < deadline, c.get(f"/api/v1/jobs/{job}").json()
                time.sleep(0.2)
            yield Site(server, acc, alice, bob, job, port)
            c.post(f"/api/v1/jobs/{job}/cancel")
        finally:
            server.terminate()


def start(site: Site, tok: str, *args: str) -> tuple[subprocess.Popen, int]:
    """`yard port-forward` running, and the local port its first line says it forwards from."""
    p = subprocess.Popen([YARD, "port-forward", *args], env=site.env(tok), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline() if p.stdout else ""
    assert line.startswith("Forwarding from 127.0.0.1:"), (line, p.stderr.read() if p.stderr else "")
    return p, int(line.split("127.0.0.1:")[1].split()[0])


def stop(p: subprocess.Popen) -> tuple[int, str]:
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=15)
    return p.returncode, err


def get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=20) as r:
        return r.read().decode()


def test_a_local_port_reaches_the_jobs_server_connected_as_its_owner(site: Site) -> None:
    p, local = start(site, site.alice, str(site.job), f":{site.port}")
    try:
        assert local != site.port
        for i in range(3):  # each request a connection of its own, each its own WebSocket
            assert get(local, f"/x{i}") == f"uid={site.acc.uid('alice')} rank=0 path=/x{i}"
    finally:
        code, err = stop(p)
    assert code == 0, err
    events = httpx.get(f"{site.server.url}/api/v1/jobs/{site.job}/events",
                       headers={"Authorization": f"Bearer {site.server.token}"}).json()["events"]
    forwards = [e for e in events if e["kind"] == "job.port_forward"]
    assert forwards and forwards[-1]["data"]["port"] == site.port and forwards[-1]["actor"] == "alice"


def test_forward_in_process_serves_until_stopped(site: Site) -> None:
    """What `yard notebook` calls: the bound port back, serving on a thread, stopped on demand."""
    fwd = forward(site.server.url, site.alice, site.job, site.port)
    try:
        assert fwd.serving and fwd.port > 0
        assert get(fwd.port, "/nb") == f"uid={site.acc.uid('alice')} rank=0 path=/nb"
    finally:
        fwd.stop()
    assert not fwd.serving and fwd.error is None
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", fwd.port), 2).close()


def test_another_teams_member_is_refused_at_once(site: Site) -> None:
    p = subprocess.run([YARD, "port-forward", str(site.job), str(site.port)], env=site.env(site.bob),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    assert "cannot forward a port in job" in p.stderr and "only its owner" in p.stderr, p.stderr
    with pytest.raises(Refused) as e:
        forward(site.server.url, site.bob, site.job, site.port)
    assert e.value.status == 403


def test_a_port_nothing_listens_on_is_a_warning_then_each_connection_is_refused_clearly(site: Site) -> None:
    closed = free_port()
    p, local = start(site, site.alice, str(site.job), f"0:{closed}")
    try:
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            get(local, "/")
        assert p.poll() is None  # still serving: the job's server may start later
    finally:
        code, err = stop(p)
    assert code == 0
    assert f"nothing listens on port {closed} in job {site.job} rank 0" in err, err


@pytest.mark.parametrize("ports", ["x", "1:2:3", "0", "70000", "8888:0", "-1:80"])
def test_a_bad_local_remote_is_exit_2_naming_it(site: Site, ports: str) -> None:
    p = subprocess.run([YARD, "port-forward", str(site.job), ports], env=site.env(site.alice),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert "[LOCAL:]REMOTE" in p.stderr


def test_a_job_that_is_not_running_is_refused_at_once_with_its_state(site: Site) -> None:
    c = httpx.Client(base_url=site.server.url, headers={"Authorization": f"Bearer {site.alice}"}, timeout=10)
    r = c.post("/api/v1/jobs", json={"command": ["true"], "team": "vision", "gpus": 1, "hold": True})
    assert r.status_code == 201, r.text
    held = r.json()["id"]
    p = subprocess.run([YARD, "port-forward", str(held), str(site.port)], env=site.env(site.alice),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "not RUNNING" in p.stderr, p.stderr
    c.post(f"/api/v1/jobs/{held}/cancel")
