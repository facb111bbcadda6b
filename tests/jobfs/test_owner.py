"""`jobfs.as_owner` and what it runs in the owner's working directory, with a real account: the
kernel checks each step as for the owner; a child that hangs on a FIFO is killed in time."""

from __future__ import annotations

import os
import pwd
import time

import pytest

from tests.accounts import ROOT_ONLY, accounts, shared_dir
from trainyard import jobfs
from trainyard.backends.base import Owner


def test_as_owner_runs_directly_when_the_plane_acts_for_nobody_else():
    assert jobfs.as_owner(None, lambda x: x + 1, 41) == 42
    with pytest.raises(FileNotFoundError):
        jobfs.as_owner(None, os.stat, "/nonexistent/x")


@ROOT_ONLY
def test_as_owner_works_with_the_owners_rights_and_times_out(tmp_path):
    with accounts({"alice": []}, []) as acc, shared_dir("ty-jobfs-") as d:
        pw = pwd.getpwnam(acc.user("alice"))
        alice = Owner(pw.pw_name, pw.pw_uid, pw.pw_gid, (pw.pw_gid,))
        work = d / "work"
        work.mkdir()
        os.chown(work, pw.pw_uid, pw.pw_gid)
        closed = d / "closed"
        closed.mkdir(mode=0o700)
        assert jobfs.as_owner(alice, jobfs.enter_problem, str(work)) is None
        assert jobfs.as_owner(alice, jobfs.enter_problem, str(closed)) == "Permission denied"
        assert jobfs.as_owner(alice, jobfs.enter_problem, str(d / "none")) == "does not exist"
        assert jobfs.as_owner(alice, os.getuid) == pw.pw_uid
        jobfs.as_owner(alice, jobfs.link_inside, str(work), "out/job.log", "/tmp/target")
        assert os.lstat(work / "out" / "job.log").st_uid == pw.pw_uid and os.readlink(work / "out" / "job.log")
        with pytest.raises(PermissionError):
            jobfs.as_owner(alice, jobfs.link_inside, str(closed), "x.log", "/tmp/target")
        assert list(closed.iterdir()) == []
        (work / "sneaky").symlink_to(closed)
        with pytest.raises(jobfs.Refused, match="sneaky is a symbolic link"):
            jobfs.as_owner(alice, jobfs.link_inside, str(work), "sneaky/x.log", "/tmp/target")
        os.mkfifo(work / "fifo")
        os.chown(work / "fifo", pw.pw_uid, pw.pw_gid)
        t = time.monotonic()
        with pytest.raises(TimeoutError):
            jobfs.as_owner(alice, lambda p: open(p).read(), str(work / "fifo"), timeout_s=0.5)
        assert time.monotonic() - t < 5


@ROOT_ONLY
def test_a_read_that_fails_still_ends_and_reaps_the_child(monkeypatch):
    """The parent's read raising (not a timeout) must not leave the child running: it is killed
    and reaped, and the read's own error is what the caller sees (it was an UnboundLocalError
    once, and the child lived on)."""
    from trainyard.jobfs import owner as owner_mod

    forked: list[int] = []
    real_fork = os.fork

    def fork() -> int:
        pid = real_fork()
        if pid:
            forked.append(pid)
        return pid

    def read_fails(fd: int, deadline: float) -> bytes | None:
        raise OSError(5, "the pipe broke")

    monkeypatch.setattr(owner_mod.os, "fork", fork)
    monkeypatch.setattr(owner_mod, "_read_until", read_fails)
    nobody = Owner("nobody", 65534, 65534, (65534,))
    with pytest.raises(OSError, match="the pipe broke"):
        jobfs.as_owner(nobody, time.sleep, 30)
    assert len(forked) == 1
    with pytest.raises(ChildProcessError):  # already reaped by as_owner
        os.waitpid(forked[0], os.WNOHANG)
