"""`LocalBackend.open_terminal` (issue 38, `yard shell`): a command in a running rank's place, on a
real pseudo-terminal, as a real owner account, read and written through `Terminal.fd` alone.

Bare ranks here; a rank in an image in test_terminal_container.py.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.accounts import ROOT_ONLY, Accounts, accounts, shared_dir
from tests.backends.helpers import NODES, make_spec, marked_processes, wait_done, wait_until
from tests.backends.terminal_io import Screen
from trainyard.backends import BackendError, LocalBackend
from trainyard.backends.base import LaunchSpec, Owner

pytestmark = ROOT_ONLY

# each rank leaves a mark in its private /tmp, then waits
RANK_CMD = ["sh", "-c", 'echo "rank $RANK was here" > /tmp/mark-$RANK; exec sleep 300']
SHOW = ('id -un; echo "rank=$RANK term=$TERM"; cat /proc/self/cgroup; '
        'i=0; while [ ! -f /tmp/mark-$RANK ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done; '
        'cat /tmp/mark-$RANK; pwd; echo END')


@pytest.fixture(scope="module")
def users() -> Iterator[Accounts]:
    with accounts({"alice": ["teama"]}, ["teama"]) as made:
        yield made


@pytest.fixture
def place() -> Iterator[Path]:
    with shared_dir("tyterm-") as d:
        yield d


@pytest.fixture(params=["auto", "subreaper"])
def backend(place: Path, request: pytest.FixtureRequest) -> Iterator[LocalBackend]:
    """This machine's best cell (cgroups), and the subreaper mode (no cgroup to join: the
    release ends a terminal's session by itself)."""
    data = place / "data"
    data.mkdir(mode=0o711)
    be = LocalBackend(data, NODES, containment=request.param)
    yield be
    for a in be.poll():
        be.release(a.job_id, a.attempt)
    assert wait_until(lambda: marked_processes(data) == [], 10, "nothing of the jobs left")


def owner(users: Accounts) -> Owner:
    pw = pwd.getpwnam(users.user("alice"))
    return Owner(pw.pw_name, pw.pw_uid, pw.pw_gid, (pw.pw_gid, users.gid("teama")))


def two_ranks(place: Path, job: int, who: Owner, command: list[str] = RANK_CMD) -> LaunchSpec:
    work = place / f"work-{job}"
    work.mkdir(mode=0o700)
    os.chown(work, who.uid, who.gid)
    spec = make_spec(place / "data", job, command, ranks=((0, "node0", (0,)), (1, "node1", (0,))), workdir=work)
    return replace(spec, owner=who)


def record(place: Path, job: int, rank: int) -> dict:
    return json.loads((place / "data" / "jobs" / str(job) / "run" / "attempt-1" / f"rank-{rank}.json").read_text())


def test_a_command_in_rank_1_runs_as_its_owner_with_its_environment_cgroups_and_tmp(backend, place, users):
    who = owner(users)
    spec = two_ranks(place, 1, who)
    backend.launch(spec)
    screen = Screen(backend.open_terminal(1, 1, 1, ["sh", "-c", SHOW], rows=30, cols=100, term="vt100"))
    try:
        status = screen.finish()
    finally:
        screen.close()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, screen.seen
    out = screen.seen.split("\n")
    assert out[0] == who.user, screen.seen
    assert out[1] == "rank=1 term=vt100"
    cgroups = Path(f"/proc/{record(place, 1, 1)['child_pid']}/cgroup").read_text().splitlines()
    assert out[2:2 + len(cgroups)] == cgroups, screen.seen
    assert any("trainyard" in line for line in cgroups) or backend.containment == "subreaper", cgroups  # the cell's
    rest = out[2 + len(cgroups):]
    assert rest[:3] == ["rank 1 was here", spec.workdir, "END"], screen.seen


def test_ctrl_c_and_ctrl_z_reach_the_foreground_command_the_shell_lives_on_and_exit_3_is_the_status(backend, place, users):
    backend.launch(two_ranks(place, 2, owner(users)))
    screen = Screen(backend.open_terminal(2, 1, 0, [], rows=24, cols=80))  # the owner's shell (/bin/sh)
    try:
        screen.send("echo ready-$((20+1))\n")
        screen.expect(r"ready-21")
        screen.send("sleep 100\n")
        screen.wait_for_child("sleep")
        screen.send("\x03")  # Ctrl-C: SIGINT to the foreground job, not to the session
        screen.expect(r"\^C[\s\S]*?[$#] ", timeout=5)  # the shell's next prompt: a line typed now is not flushed
        screen.send("echo status-$?\n")
        screen.expect(r"status-130", timeout=5)
        screen.send("echo alive-$((1+1))\n")
        screen.expect(r"alive-2")
        screen.send("sleep 101\n")
        pid = screen.wait_for_child("sleep")
        screen.send("\x1a")  # Ctrl-Z: the foreground job stops, the shell takes the terminal back
        screen.expect(r"\^Z[\s\S]*?[$#] ", timeout=5)
        assert Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "T"
        screen.send("fg\n")  # back in the foreground, running: a Ctrl-C ends it
        wait_until(lambda: Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "T", 5, "the job to go on")
        screen.send("\x03")
        screen.expect(r"\^C[\s\S]*?[$#] ", timeout=5)
        screen.send("echo ended-$?\n")
        screen.expect(r"ended-130")
        screen.send("exit 3\n")
        status = screen.finish()
    finally:
        screen.close()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3, screen.seen


def test_the_release_of_the_attempt_ends_a_shell_left_open(backend, place, users):
    backend.launch(two_ranks(place, 3, owner(users)))
    screen = Screen(backend.open_terminal(3, 1, 1, []))
    try:
        screen.send("sleep 200 & echo bg-$((3*3))\n")
        screen.expect(r"bg-9")
        backend.release(3, 1)
        status = screen.finish(timeout=15)
    finally:
        screen.close()
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


def test_an_unknown_or_ended_rank_is_refused_naming_it(backend, place, users):
    with pytest.raises(BackendError, match="job 9 attempt 1 rank 0: no such running rank"):
        backend.open_terminal(9, 1, 0, [])
    backend.launch(two_ranks(place, 4, owner(users), ["sh", "-c", "[ $RANK = 1 ] && exec sleep 300; exit 0"]))
    with pytest.raises(BackendError, match="job 4 attempt 1 rank 2: no such running rank"):
        backend.open_terminal(4, 1, 2, [])
    wait_until(lambda: not next(a for a in backend.poll() if a.job_id == 4).ranks[0].running, 10, "rank 0 to end")
    with pytest.raises(BackendError, match="job 4 attempt 1 rank 0: the rank is not running"):
        backend.open_terminal(4, 1, 0, [])
    backend.kill_node("node1")
    with pytest.raises(BackendError, match="job 4 attempt 1 rank 1: its node node1 is dead"):
        backend.open_terminal(4, 1, 1, [])
    backend.revive_node("node1")
    wait_done(backend, 4)


def test_a_record_pointing_at_a_recycled_pid_is_refused_by_the_plane_and_by_the_helper(backend, place, users):
    backend.launch(two_ranks(place, 5, owner(users)))
    path = place / "data" / "jobs" / "5" / "run" / "attempt-1" / "rank-1.json"
    rec = json.loads(path.read_text())
    other = subprocess.Popen(["sleep", "60"])  # alive, started after the runner, but not its child
    try:
        path.write_text(json.dumps({**rec, "child_pid": other.pid, "child_start_time": None}))
        with pytest.raises(BackendError, match="job 5 attempt 1 rank 1: the rank's process is gone"):
            backend.open_terminal(5, 1, 1, [])
        # the helper checks on its own (a pid may be recycled between the plane's check and its own)
        from trainyard.backends.rundir import terminal

        t = terminal.spawn(terminal.attach_argv(path.parent, 1, ["id"]), terminal.attach_env())
        screen = Screen(t)
        try:
            status = screen.finish()
        finally:
            screen.close()
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 126
        assert "rank 1 has ended (pid" in screen.seen and "is another process now" in screen.seen, screen.seen
    finally:
        path.write_text(json.dumps(rec))
        other.kill()
        other.wait()
