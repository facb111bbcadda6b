"""`yard up --config FILE` never silently reverts live changes (issue 35 point 5), with real `yard`
processes: a restart with the same file after a `yard teams set` is refused (exit 2, the diff,
the two ways out, nothing stored); `--config-wins` stores the file; once the stored configuration
is written back to the file, or when only the file changed, the restart goes on as before."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.plane import TWO_TEAMS, YARD, YardServer


def cli(server: YardServer, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "YARD_URL": server.url, "YARD_TOKEN": server.token}
    p = subprocess.run([YARD, *args], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    return p


def versions(server: YardServer) -> list[dict]:
    return json.loads(cli(server, "cluster", "history", "--json").stdout)


def up_refused(server: YardServer) -> subprocess.CompletedProcess:
    """`yard up` with the server's file, expected to stop at once (it does not start)."""
    return subprocess.run([YARD, "up", "--data-dir", str(server.data_dir), "--port", "0", "--login-socket", "none", *server.identity,
                           "--config", str(server.config_file)], capture_output=True, text=True, timeout=60)


@pytest.fixture
def server(tmp_path: Path):
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(TWO_TEAMS.read_text())
    (tmp_path / "d").mkdir()
    s = YardServer(tmp_path / "d", config_file=cfg)
    s.start()
    yield s
    s.terminate()


def test_a_restart_that_would_revert_a_live_change_is_refused_with_the_diff(server):
    cli(server, "teams", "set", "vision", "--nominal", "3")
    stored = versions(server)
    server.terminate()
    p = up_refused(server)
    assert p.returncode == 2, p.stderr
    assert "would revert them" in p.stderr and "by admin" in p.stderr
    assert "--config-wins" in p.stderr and f"yard cluster get > {server.config_file}" in p.stderr
    assert "nominal: 3" in p.stderr  # the diff: the stored nominal goes, the file's comes
    server.start(config=False)  # without --config: starts, nothing changed
    assert versions(server) == stored


def test_config_wins_stores_the_file_and_the_old_version_stays(server):
    cli(server, "teams", "set", "vision", "--nominal", "3")
    before = versions(server)
    server.terminate()
    server.args = ("--config-wins",)
    server.start()
    after = versions(server)
    assert len(after) == len(before) + 1 and after[0]["author"] == "yard-up"
    stored = json.loads(cli(server, "cluster", "get", "--json").stdout)["text"]
    assert "{nominal: 4, borrowing_limit: 4}" in stored.split("- name: nlp")[0]  # vision's, the file's again


def test_the_file_edited_alone_or_written_back_is_applied_as_before(server):
    server.terminate()
    server.config_file.write_text(server.config_file.read_text().replace("nominal: 4", "nominal: 5", 1))
    server.start()  # only the file changed since it was given: it is the truth
    assert "nominal: 5" in cli(server, "cluster", "get").stdout
    cli(server, "teams", "set", "nlp", "--nominal", "2")
    server.config_file.write_text(cli(server, "cluster", "get").stdout)  # the stored one, written back
    server.terminate()
    server.start()  # the same settings (with `get`'s header comment): started, nothing reverted
    assert "nominal: 2" in cli(server, "cluster", "get").stdout
