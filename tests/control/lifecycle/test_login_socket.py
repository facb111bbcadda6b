"""control/lifecycle/login_socket.py on a real Unix socket: the protocol, the kernel's word on who calls
(`SO_PEERCRED`, asked by processes that really run as other accounts), and where it may listen."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.accounts import ROOT_ONLY, shared_dir
from tests.plane import Plane
from tests.security.hostile import config_text, two_accounts
from trainyard.control.lifecycle.login_socket import MAX_REQUEST, LoginSocket, LoginSocketError, plane_answer

ASK = ("import json, socket, sys\n"
       "s = socket.socket(socket.AF_UNIX)\n"
       "s.connect(sys.argv[1])\n"
       "s.sendall(sys.argv[2].encode() + b'\\n')\n"
       "print(s.makefile().readline(), end='')\n")


def ask_as(account: str | None, path: Path, request: dict) -> dict:
    """The socket's answer to `request` from a process of `account` (None: this one's)."""
    runner = ["runuser", "-u", account, "--"] if account else []
    p = subprocess.run([*runner, "/usr/bin/python3", "-c", ASK, str(path), json.dumps(request)],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def raw(path: Path, data: bytes) -> dict:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(path))
        s.sendall(data)
        return json.loads(s.makefile().readline())


@pytest.fixture
def echo() -> Iterator[Path]:
    """A socket whose answer is the caller's uid and request (the server's own logic alone), in a
    directory every account may pass through."""
    with shared_dir("ty-login-echo-") as d:
        srv = LoginSocket(d / "echo.sock", lambda uid, req: {"uid": uid, "req": req}).start()
        yield srv.path
        srv.close()
        assert not srv.path.exists()  # closing removes its socket


def test_the_uid_is_the_kernels_and_the_socket_is_open_to_all(echo):
    assert raw(echo, b'{"op": "login", "team": "nlp"}\n') == {"ok": True, "uid": os.geteuid(),
                                                              "req": {"op": "login", "team": "nlp"}}
    assert echo.stat().st_mode & 0o777 == 0o666


@ROOT_ONLY
def test_a_process_of_another_account_is_seen_as_that_account(echo):
    assert ask_as("nobody", echo, {"op": "login"})["uid"] == int(subprocess.check_output(["id", "-u", "nobody"]))


@pytest.mark.parametrize("data, says", [
    (b"not json\n", "one line of JSON"),
    (b"[1, 2]\n", "JSON object"),
    (b'{"op": "grant"}\n', "unknown op"),
    (b'{"team": 7}\n', "team must be a name"),
    (b'{"user": ""}\n', "user must be a name"),
    (b"x" * (MAX_REQUEST + 10), "longer than"),
    (b"\xff\xfe\n", "one line of JSON"),
])
def test_bad_requests_are_refused_clearly(echo, data, says):
    out = raw(echo, data)
    assert out["ok"] is False and says in out["error"] and out["status"] == 400


def test_a_caller_that_never_writes_does_not_block_the_others(echo):
    with socket.socket(socket.AF_UNIX) as idle:
        idle.connect(str(echo))
        assert raw(echo, b"{}\n")["ok"] is True


def test_a_stale_socket_is_replaced_a_live_one_and_other_files_are_not(tmp_path):
    path = tmp_path / "p.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))
    dead.close()  # a plane killed with -9 leaves its socket behind
    first = LoginSocket(path, lambda uid, req: {}).start()
    try:
        with pytest.raises(LoginSocketError, match="another control plane answers"):
            LoginSocket(path, lambda uid, req: {}).start()
    finally:
        first.close()
    path.write_text("")
    with pytest.raises(LoginSocketError, match="not a socket"):
        LoginSocket(path, lambda uid, req: {}).start()
    assert path.read_text() == ""


def test_a_directory_others_may_write_is_refused(tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    with pytest.raises(LoginSocketError, match="writable by no one else"):
        LoginSocket(d / "p.sock", lambda uid, req: {}).start()
    assert list(d.iterdir()) == []


@ROOT_ONLY
def test_the_plane_answers_each_account_with_its_own_token_only():
    """A root plane, two real accounts of two teams: each gets a token of its own user and team;
    naming the other user is refused; the token works at the API as that user."""
    with two_accounts() as acc, shared_dir("ty-login-sock-") as base:
        cfg = base / "cluster.yaml"
        cfg.write_text(config_text(acc))
        p = Plane(base / "yard", config=cfg, run_as=None, allow_root_jobs=None, start=False)
        srv = LoginSocket(base / "plane.sock", plane_answer(p.cp)).start()
        try:
            a = ask_as(acc.user("alice"), srv.path, {"op": "login"})
            assert (a["ok"], a["user"], a["team"], a["role"], a["account"]) == (True, "alice", "vision", "member",
                                                                               acc.user("alice"))
            b = ask_as(acc.user("bob"), srv.path, {"op": "login", "user": "bob"})
            assert (b["user"], b["team"]) == ("bob", "nlp")
            assert p.client(a["token"]).get("/api/v1/whoami").json() == {"user": "alice", "role": "member",
                                                                        "team": "vision", "job_id": None}
            steal = ask_as(acc.user("bob"), srv.path, {"op": "login", "user": "alice", "team": "vision"})
            assert steal["ok"] is False and steal["status"] == 403 and "token" not in steal
            assert "not a member of team 'vision'" in steal["error"]
            steal = ask_as(acc.user("bob"), srv.path, {"op": "login", "user": "alice"})
            assert steal["ok"] is False and "you are 'bob', not 'alice'" in steal["error"]
            root = ask_as(None, srv.path, {"op": "login"})
            assert root["ok"] is False and "root" in root["error"]
            listed = p.admin.get("/api/v1/tokens").json()["tokens"]
            assert sorted((t["user"], t["team"], t["created_by"]) for t in listed if t["role"] == "member") == \
                [("alice", "vision", "login:socket"), ("bob", "nlp", "login:socket")]
        finally:
            srv.close()
            p.cp.stop()
