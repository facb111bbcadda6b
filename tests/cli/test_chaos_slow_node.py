"""`yard chaos slow-node NODE --factor F` and `revive-node NODE`: the input checks (exit 2 naming
the argument, nothing recorded) in-process, and one real `yard` process that slows and revives a
node through the local backend's state files, against a real HTTP server standing in for the
plane's node list (the only thing these scenarios ask the plane)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainyard.cli.main import app

NODES = {"nodes": [{"name": "node0", "gpus": 4, "gpu_model": "emulated", "gpu_mem_gb": 16, "state": "idle"},
                   {"name": "node1", "gpus": 4, "gpu_model": "emulated", "gpu_mem_gb": 16, "state": "idle"}]}


class _Nodes(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = json.dumps(NODES if self.path.startswith("/api/v1/nodes") else {"detail": "not found"}).encode()
        self.send_response(200 if self.path.startswith("/api/v1/nodes") else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def plane(tmp_path: Path):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Nodes)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    env = {"YARD_URL": f"http://127.0.0.1:{srv.server_address[1]}", "YARD_TOKEN": "t", "YARD_DATA_DIR": str(tmp_path)}
    yield env
    srv.shutdown()
    srv.server_close()


def chaos(env: dict[str, str], *args: str):  # noqa: ANN201
    return CliRunner().invoke(app, ["chaos", *args], env=env)


@pytest.mark.parametrize("args, words", [
    (["slow-node", "node0"], ["--factor", "required"]),
    (["slow-node", "node0", "--factor", "1"], ["--factor", "> 1"]),
    (["slow-node", "node0", "--factor", "0.5"], ["--factor", "> 1"]),
    (["slow-node", "node0", "--factor", "-3"], ["--factor"]),
    (["slow-node", "node0", "--factor", "1000"], ["--factor", "<= 100"]),
    (["slow-node", "node0", "--factor", "nan"], ["--factor"]),
    (["slow-node", "node0", "--factor", "fast"], ["--factor"]),
    (["slow-node", "--factor", "2"], ["NODE", "required"]),
    (["slow-node", "node0", "--node", "node1", "--factor", "2"], ["NODE", "disagree"]),
    (["kill-rank", "node0", "--job", "1"], ["NODE", "kill-rank"]),
    (["revive-node", "node0", "--factor", "2"], ["--factor", "only with slow-node"]),
    (["slow-node", "node9", "--factor", "2"], ["unknown node 'node9'", "node0, node1"]),
])
def test_bad_input_exits_2_naming_it_and_records_nothing(plane, tmp_path, args, words):
    r = chaos(plane, *args)
    assert r.exit_code == 2, r.output
    for w in words:
        assert w in r.stderr, r.stderr
    assert not (tmp_path / "nodes").exists() or not list((tmp_path / "nodes").iterdir())


def test_a_real_yard_slows_and_revives_a_node(plane, tmp_path):
    from trainyard.backends import LocalBackend
    from trainyard.backends.base import NodeInfo

    probe = LocalBackend(tmp_path, [NodeInfo("node0", 4, "emulated", 16384)])
    probe.close()
    if probe.containment == "subreaper":
        pytest.skip("no cgroup containment here (the refusal is tested in tests/backends/local/test_slow_node.py)")
    env = {**os.environ, **plane}
    run = [sys.executable, "-m", "trainyard.cli.main", "chaos"]
    r = subprocess.run([*run, "slow-node", "node0", "--factor", "2.5"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "slowed node node0 by 2.5x" in r.stdout and "revive-node node0" in r.stdout
    state = json.loads((tmp_path / "nodes" / "node0.json").read_text())
    assert state["state"] == "up" and state["slow"] == 2.5
    r = subprocess.run([*run, "revive-node", "--node", "node0"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "slow" not in json.loads((tmp_path / "nodes" / "node0.json").read_text())
