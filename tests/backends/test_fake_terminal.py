"""`FakeBackend.open_terminal`: a real pty running the command as the plane's own user with the fake
rank's environment (the API's tests of `yard shell` run on the fake plane)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.backends.helpers import NODES
from tests.backends.terminal_io import Screen
from trainyard.backends.base import BackendError, LaunchSpec
from trainyard.backends.fake import FakeBackend, FakeCluster
from trainyard.clock import FakeClock
from trainyard.contracts import JobDir, RankPlacement


@pytest.fixture
def fake(tmp_path: Path):
    be = FakeBackend(tmp_path, NODES, clock=FakeClock(1_000_000.0))
    yield be
    FakeCluster.forget(tmp_path)


def spec(data_dir: Path, job_id: int, *tokens: str) -> LaunchSpec:
    jd = JobDir.of(data_dir, job_id)
    return LaunchSpec(job_id, 1, ["yard-fake", *tokens], str(data_dir), str(jd.root),
                      [RankPlacement(0, "node0", (0,)), RankPlacement(1, "node1", (0,))], {"FROM_SUBMIT": "yes"},
                      str(jd.checkpoints))


def test_a_terminal_runs_the_command_with_the_ranks_environment_on_a_pty(fake, tmp_path):
    fake.launch(spec(tmp_path, 1, "run=60"))
    screen = Screen(fake.open_terminal(1, 1, 1, ["sh", "-c", 'echo "$RANK $FROM_SUBMIT $TERM"; tty; exit 4'],
                                       term="vt100"))
    try:
        status = screen.finish()
    finally:
        screen.close()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 4, screen.seen
    lines = screen.seen.split("\n")
    assert lines[0] == "1 yes vt100" and lines[1].startswith("/dev/pts/"), screen.seen


def test_ctrl_c_reaches_the_foreground_command_of_a_fake_terminal(fake, tmp_path):
    fake.launch(spec(tmp_path, 2, "run=60"))
    screen = Screen(fake.open_terminal(2, 1, 0, ["sh", "-i"]))
    try:
        screen.send("sleep 100\n")
        screen.wait_for_child("sleep")
        screen.send("\x03")
        screen.expect(r"\^C[\s\S]*?[$#] ", timeout=5)  # the shell's next prompt: a line typed now is not flushed
        screen.send("echo status-$?\n")
        screen.expect(r"status-130")
        screen.send("exit 3\n")
        status = screen.finish()
    finally:
        screen.close()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3, screen.seen


def test_an_ended_or_unknown_rank_or_a_dead_node_is_refused(fake, tmp_path):
    with pytest.raises(BackendError, match="job 7 attempt 1 rank 0: no such running rank"):
        fake.open_terminal(7, 1, 0, [])
    fake.launch(spec(tmp_path, 3, "run=5"))
    fake.kill_node("node1")
    with pytest.raises(BackendError, match="job 3 attempt 1 rank 1: its node node1 is dead"):
        fake.open_terminal(3, 1, 1, [])
    fake.clock.advance(10)
    with pytest.raises(BackendError, match="job 3 attempt 1 rank 0: the rank is not running"):
        fake.open_terminal(3, 1, 0, [])
