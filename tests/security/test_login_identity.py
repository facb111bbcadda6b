"""Issue 35's acceptance for `yard login`: on the plane's host the Unix account is the identity.

A real root `yard up` (its login socket in a temporary directory), real Unix accounts made for the
test (alice in vision's group, bob in nlp's, eve in none), and the real `yard` command run as each
of them (`runuser`, an interpreter they can reach: tests/accounts.py). Each logs in and is who they
are; nobody obtains a token for someone else, by the socket or by a code.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.accounts import ROOT_ONLY, Accounts, accounts, python_for_accounts, shared_dir
from tests.plane import YardServer
from tests.security.hostile import config_text

# One worker for this module's tests under `make test`'s --dist loadgroup: its accounts and its
# yard up are made once, not once per worker.
pytestmark = [ROOT_ONLY, pytest.mark.xdist_group("security-login-identity")]

ASK = ("import json, socket, sys\n"
       "s = socket.socket(socket.AF_UNIX)\n"
       "s.connect(sys.argv[1])\n"
       "s.sendall(sys.argv[2].encode() + b'\\n')\n"
       "print(s.makefile().readline(), end='')\n")


@dataclass
class Site:
    server: YardServer
    acc: Accounts
    base: Path
    py: tuple[str, str]
    sock: Path

    def config_home(self, role: str, which: str = "a") -> Path:
        """`role`'s own config dir (XDG_CONFIG_HOME), under a home of theirs (0700)."""
        home = self.base / f"home-{role}"
        if not home.exists():
            home.mkdir(mode=0o700)
            os.chown(home, self.acc.uid(role), -1)
        return home / f"config-{which}"

    def cmd(self, role: str, *args: str, which: str = "a") -> list[str]:
        exe, path = self.py
        return ["runuser", "-u", self.acc.user(role), "--", "env", "-i", "PATH=/usr/bin:/bin", "LANG=C.UTF-8",
                f"HOME={self.base / f'home-{role}'}", f"XDG_CONFIG_HOME={self.config_home(role, which)}",
                f"YARD_URL={self.server.url}", f"PYTHONPATH={path}", exe, "-m", "trainyard.cli.main", *args]

    def yard(self, role: str, *args: str, ok: bool = True, which: str = "a") -> subprocess.CompletedProcess:
        p = subprocess.run(self.cmd(role, *args, which=which), capture_output=True, text=True, timeout=60)
        if ok:
            assert p.returncode == 0, f"{role}: yard {' '.join(args)} → {p.returncode}\n{p.stdout}\n{p.stderr}"
        return p

    def ask_socket(self, role: str, request: dict) -> dict:
        p = subprocess.run(["runuser", "-u", self.acc.user(role), "--", "/usr/bin/python3", "-c", ASK,
                            str(self.sock), json.dumps(request)], capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    def token_of(self, role: str, which: str = "a") -> str:
        data = json.loads((self.config_home(role, which) / "trainyard" / "token").read_text())
        return data["tokens"][self.server.url]


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    py = python_for_accounts()
    if py is None:
        pytest.skip("no Python interpreter other accounts may run")
    with accounts({"alice": ["vis"], "bob": ["nlp"], "eve": []}, ["vis", "nlp"]) as acc, \
            shared_dir("ty-login-") as base:
        cfg = base / "cluster.yaml"
        cfg.write_text(config_text(acc))
        (base / "yard").mkdir()
        sock = base / "plane.sock"
        server = YardServer(base / "yard", config_file=cfg, identity=False, args=("--login-socket", str(sock)))
        server.start()
        try:
            yield Site(server, acc, base, py, sock)
        finally:
            server.terminate()
        assert not sock.exists()  # the plane removes its socket when it stops


def test_each_account_logs_in_as_itself_with_its_team(site):
    out = site.yard("alice", "login").stdout
    assert "as alice (member, team vision)" in out
    assert site.yard("alice", "whoami").stdout.startswith("alice (member, team vision)")
    assert site.yard("bob", "login").returncode == 0
    me = json.loads(site.yard("bob", "whoami", "--json").stdout)
    assert (me["user"], me["role"], me["team"]) == ("bob", "member", "nlp")
    f = site.config_home("bob") / "trainyard" / "token"
    st, dst = f.stat(), f.parent.stat()
    assert (stat.S_IMODE(st.st_mode), stat.S_IMODE(dst.st_mode)) == (0o600, 0o700)
    assert st.st_uid == dst.st_uid == site.acc.uid("bob")
    assert site.token_of("alice") != site.token_of("bob")


def test_another_teams_member_cannot_obtain_a_token_for_someone_else(site):
    # by the socket: naming alice, or alice's team
    for req in ({"op": "login", "user": "alice"}, {"op": "login", "user": "alice", "team": "vision"}):
        out = site.ask_socket("bob", req)
        assert out["ok"] is False and out["status"] == 403 and "token" not in out
    p = site.yard("bob", "login", "--team", "vision", ok=False, which="steal")
    assert p.returncode == 2 and "not a member of team 'vision'" in p.stderr
    assert not (site.config_home("bob", "steal") / "trainyard" / "token").exists()
    # by a code: alice (elsewhere) asks for one; bob's approval is refused, alice's own session's works
    site.yard("bob", "login")
    site.yard("alice", "login")
    waiting = subprocess.Popen(site.cmd("alice", "login", "--code", which="remote"), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        code = None
        deadline = time.monotonic() + 60
        while code is None and time.monotonic() < deadline:
            line = waiting.stderr.readline()
            assert line, waiting.stderr.read()
            if "yard login approve" in line:
                code = line.split()[-1]
        assert code is not None
        refused = site.yard("bob", "login", "approve", code, ok=False)
        assert refused.returncode == 2 and "for user 'alice', not you ('bob')" in refused.stderr
        refused = site.yard("bob", "login", "approve", code, "--team", "nlp", ok=False)
        assert refused.returncode == 2
        assert f"approved {code}: alice gets a member token, team vision" in site.yard(
            "alice", "login", "approve", code).stdout
        out, err = waiting.communicate(timeout=30)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 0, err
    assert "as alice (member, team vision)" in out
    assert site.yard("alice", "whoami", which="remote").stdout.startswith("alice (member, team vision)")
    assert site.yard("alice", "login", "approve", code, ok=False).returncode == 2  # used once
    admin = httpx.Client(base_url=site.server.url, headers={"Authorization": f"Bearer {site.server.token}"})
    listed = admin.get("/api/v1/tokens").json()["tokens"]
    assert {(t["user"], t["team"]) for t in listed if t["role"] == "member"} == {("alice", "vision"), ("bob", "nlp")}
    assert any(t["created_by"] == "login:code approved by alice" for t in listed)


def test_an_account_in_no_team_is_refused(site):
    p = site.yard("eve", "login", ok=False)
    assert p.returncode == 2 and "maps to no team" in p.stderr
    assert not (site.config_home("eve") / "trainyard" / "token").exists()


def test_a_person_lists_only_their_own_tokens(site):
    site.yard("bob", "login")
    mine = json.loads(site.yard("bob", "token", "list", "--json").stdout)
    assert mine and {t["user"] for t in mine} == {"bob"}
    p = site.yard("bob", "token", "list", "--user", "alice", ok=False)
    assert p.returncode == 2 and "only an admin" in p.stderr


def test_logout_revokes_the_token_and_forgets_it(site):
    site.yard("alice", "login", which="out")
    tok = site.token_of("alice", "out")
    assert "revoked and forgotten" in site.yard("alice", "logout", which="out").stdout
    assert json.loads((site.config_home("alice", "out") / "trainyard" / "token").read_text() if (
        site.config_home("alice", "out") / "trainyard" / "token").exists() else '{"tokens": {}}')["tokens"] == {}
    r = httpx.get(f"{site.server.url}/api/v1/whoami", headers={"Authorization": f"Bearer {tok}"})
    assert r.status_code == 401
    p = site.yard("alice", "whoami", ok=False, which="out")
    assert p.returncode == 2 and "no token" in p.stderr
    assert "not logged in" in site.yard("alice", "logout", which="out").stdout
