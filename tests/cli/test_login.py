"""`yard login`, `yard logout`, `yard whoami` and the token file (cli/login.py, cli/token_file.py),
against a real `yard up` process. The identity over the socket, as real accounts:
tests/security/test_login_identity.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.plane import YARD, YARD_UP_IDENTITY, YardServer
from trainyard.cli import token_file


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    return tmp_path / "cfg"


def test_the_token_file_is_private_per_url_and_written_whole(config_home):
    assert token_file.path() == config_home / "trainyard" / "token"
    token_file.save("http://a:1/", "ty_a")
    token_file.save("http://b:2", "ty_b")
    token_file.save("http://a:1", "ty_a2")  # a new login replaces the old token
    f = token_file.path()
    assert stat.S_IMODE(f.stat().st_mode) == 0o600 and stat.S_IMODE(f.parent.stat().st_mode) == 0o700
    assert (token_file.read("http://a:1"), token_file.read("http://b:2/"), token_file.read("http://c")) == \
        ("ty_a2", "ty_b", None)
    assert sorted(p.name for p in f.parent.iterdir()) == ["token"]  # no temporary file left behind
    assert token_file.remove("http://a:1") == "ty_a2" and token_file.remove("http://a:1") is None
    assert token_file.read("http://b:2") == "ty_b"
    token_file.remove("http://b:2")
    assert not f.exists()


def test_without_xdg_config_home_it_is_under_home(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert token_file.path() == tmp_path / ".config" / "trainyard" / "token"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/dir")  # the XDG spec: a relative path is ignored
    assert token_file.path() == tmp_path / ".config" / "trainyard" / "token"


def test_a_file_others_may_read_or_a_link_is_not_used(config_home, capsys):
    token_file.save("http://a:1", "ty_a")
    f = token_file.path()
    f.chmod(0o644)
    assert token_file.read("http://a:1") is None
    assert "readable by others" in capsys.readouterr().err
    f.chmod(0o600)
    real = f.parent / "elsewhere"
    f.rename(real)
    f.symlink_to(real)
    assert token_file.read("http://a:1") is None


# -- the commands, against a real plane ------------------------------------------------------------


# One worker for this module's tests under `make test`'s --dist loadgroup: its module-scoped
# yard up starts once, not once per worker (about 4 s of CPU each).
pytestmark = pytest.mark.xdist_group("cli-login")


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[YardServer]:
    s = YardServer(tmp_path_factory.mktemp("login") / "yard", args=("--login-socket", "none"), identity=False)
    s.data_dir.mkdir()
    s.start()
    yield s
    s.terminate()


def yard(server: YardServer, cfg: Path, *args: str, token: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("YARD_TOKEN", "YARD_LOGIN_SOCKET")}
    env.update(YARD_URL=server.url, XDG_CONFIG_HOME=str(cfg), YARD_DATA_DIR=str(cfg / "no-data-dir"),
               **({"YARD_TOKEN": token} if token else {}))
    return subprocess.run([YARD, *args], capture_output=True, text=True, env=env, timeout=60)


def wait_for_code(proc: subprocess.Popen) -> str:
    for line in proc.stderr:
        if "yard login approve" in line:
            return line.split()[-1]
    raise AssertionError(f"no code shown: {proc.communicate()}")


def test_without_a_socket_login_points_to_codes(server, tmp_path):
    p = yard(server, tmp_path, "login")
    assert p.returncode == 2 and "no login socket on this host" in p.stderr and "yard login --code" in p.stderr
    p = yard(server, tmp_path, "login", "--user", "carol")
    assert p.returncode == 2 and "--user goes with --code" in p.stderr


def test_a_code_approved_by_an_admin_logs_in_then_logout(server, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "YARD_TOKEN"}
    env.update(YARD_URL=server.url, XDG_CONFIG_HOME=str(tmp_path), YARD_DATA_DIR=str(tmp_path / "none"))
    waiting = subprocess.Popen([YARD, "login", "--code", "--user", "carol", "--team", "nlp"], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        code = wait_for_code(waiting)
        no_team = yard(server, tmp_path / "x", "login", "approve", code, "--team", "nope", token=server.token)
        assert no_team.returncode == 2 and "unknown team 'nope'" in no_team.stderr
        ok = yard(server, tmp_path / "x", "login", "approve", code, "--json", token=server.token)
        assert json.loads(ok.stdout) == {"code": code, "user": "carol", "role": "member", "team": "nlp"}
        out, err = waiting.communicate(timeout=30)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 0 and "as carol (member, team nlp)" in out, err
    assert yard(server, tmp_path, "whoami").stdout.startswith("carol (member, team nlp)")
    own = json.loads(yard(server, tmp_path, "token", "list", "--json").stdout)
    assert [(t["user"], t["created_by"]) for t in own] == [("carol", "login:code approved by admin")]
    again = yard(server, tmp_path / "x", "login", "approve", code, token=server.token)
    assert again.returncode == 2 and "expired" in again.stderr  # used once
    out = yard(server, tmp_path, "logout")
    assert out.returncode == 0 and "revoked and forgotten" in out.stdout
    who = yard(server, tmp_path, "whoami")
    assert who.returncode == 2 and "no token" in who.stderr


def test_an_admin_gives_the_role_a_code_gets(server, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "YARD_TOKEN"}
    env.update(YARD_URL=server.url, XDG_CONFIG_HOME=str(tmp_path), YARD_DATA_DIR=str(tmp_path / "none"))
    waiting = subprocess.Popen([YARD, "login", "--code", "--user", "olga"], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        code = wait_for_code(waiting)
        bare = yard(server, tmp_path / "x", "login", "approve", code, token=server.token)
        assert bare.returncode == 2 and "give one (--team)" in bare.stderr
        assert "olga gets a viewer token" in yard(server, tmp_path / "x", "login", "approve", code.lower(), "--role",
                                                  "viewer", token=server.token).stdout
        waiting.communicate(timeout=30)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 0
    me = json.loads(yard(server, tmp_path, "whoami", "--json").stdout)
    assert (me["user"], me["role"], me["team"]) == ("olga", "viewer", None)


def test_logout_when_the_plane_revoked_the_token_already(server, tmp_path, monkeypatch):
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"})
    tok = admin.post("/api/v1/tokens", json={"user": "dora", "role": "viewer"}).json()["token"]
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    token_file.save(server.url, tok)
    assert yard(server, tmp_path, "whoami").stdout.startswith("dora (viewer)")
    assert admin.post("/api/v1/tokens/revoke", json={"user": "dora"}).status_code == 200
    out = yard(server, tmp_path, "logout")
    assert out.returncode == 0 and "no longer knew the token" in out.stdout
    assert not (tmp_path / "trainyard" / "token").exists()
    assert "not logged in" in yard(server, tmp_path, "logout").stdout


def test_yard_up_refuses_a_login_socket_where_others_may_write(tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    (tmp_path / "yard").mkdir()
    p = subprocess.run([YARD, "up", "--data-dir", str(tmp_path / "yard"), "--port", "0", *YARD_UP_IDENTITY,
                        "--login-socket", str(d / "p.sock")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--login-socket:" in p.stderr and "writable by no one else" in p.stderr
    assert list(d.iterdir()) == []
