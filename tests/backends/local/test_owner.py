"""The local backend starts each rank as `LaunchSpec.owner` (a real Unix account made for the test)."""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from trainyard.backends import BackendError
from trainyard.backends.base import Owner

from tests.backends.helpers import make_spec, wait_done

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starting a rank as another user needs root")


@pytest.fixture
def account():
    """A throwaway user with its own group and a second (team) group; removed afterwards."""
    name, team = f"tyo{os.getpid() % 100000}", f"tyt{os.getpid() % 100000}"
    subprocess.run(["groupadd", team], check=True)
    subprocess.run(["useradd", "-M", "-d", f"/home/{name}", "-s", "/bin/sh", "-G", team, name], check=True)
    try:
        pw = pwd.getpwnam(name)
        yield Owner(name, pw.pw_uid, pw.pw_gid, (pw.pw_gid, grp.getgrnam(team).gr_gid)), team
    finally:
        subprocess.run(["userdel", name], check=False)
        subprocess.run(["groupdel", team], check=False)


def test_the_command_runs_as_the_owner_with_its_groups_home_and_an_owned_log(backend, tmp_path, account):
    owner, team = account
    spec = replace(make_spec(tmp_path, 1, ["sh", "-c", 'id -un; id -Gn; echo "$HOME $USER $LOGNAME"'],
                             workdir=Path("/")), owner=owner)  # a workdir the owner may enter
    backend.launch(spec)
    state = wait_done(backend, 1)
    assert state.ranks[0].exit_code == 0
    log = tmp_path / "jobs" / "1" / "logs" / "rank-0.log"
    lines = log.read_text().splitlines()
    assert lines[1] == owner.user
    assert team in lines[2].split()
    assert lines[3] == f"/home/{owner.user} {owner.user} {owner.user}"
    assert (log.stat().st_uid, log.stat().st_gid) == (owner.uid, owner.gid)


def test_an_identity_that_cannot_be_taken_fails_the_launch_with_the_user_named(backend, tmp_path):
    # setgroups with a negative id fails: the launch says who it could not run as, and nothing runs.
    bad = Owner("nobody-such", 65534, 65534, (-5,))
    with pytest.raises(BackendError, match="cannot run as nobody-such"):
        backend.launch(replace(make_spec(tmp_path, 2, ["true"]), owner=bad))
