"""The plane's side of a terminal (`rundir/terminal.py`): a new pty of the asked size in a new
session, resized while it runs, and the release's end of what a terminal's session left behind."""

from __future__ import annotations

import os
import signal

from tests.backends.helpers import wait_until
from tests.backends.terminal_io import Screen
from trainyard.backends.rundir import procfs, terminal

ENV = {"PATH": terminal.DEFAULT_PATH, "TERM": "vt100"}


def test_the_pty_has_the_asked_size_and_a_resize_reaches_the_command():
    t = terminal.spawn(terminal.with_ctty(["sh", "-c", 'stty size; echo "sid=$(ps -o sid= -p $$)"; read x; stty size']),
                       ENV, rows=30, cols=90)
    screen = Screen(t)
    try:
        screen.expect(r"30 90\n")
        sid = int(screen.expect(r"sid=\s*(\d+)").group(1))
        assert sid == t.pid  # a session of its own: the terminal's process leads it
        terminal.set_size(t.fd, 40, 120)
        screen.send("\n")
        screen.expect(r"40 120\n")
        assert os.WEXITSTATUS(screen.finish()) == 0
    finally:
        screen.close()


def test_a_size_out_of_range_is_clamped_not_an_error():
    t = terminal.spawn(terminal.with_ctty(["stty", "size"]), ENV, rows=0, cols=10**6)
    screen = Screen(t)
    try:
        screen.expect(r"1 65535\n")
        screen.finish()
    finally:
        screen.close()


def test_a_command_that_is_not_there_is_one_line_and_127():
    screen = Screen(terminal.spawn(terminal.with_ctty(["no-such-command-here"]), ENV))
    try:
        status = screen.finish()
    finally:
        screen.close()
    assert os.WEXITSTATUS(status) == 127 and "cannot execute 'no-such-command-here'" in screen.seen, screen.seen


def test_end_sessions_kills_the_session_and_skips_a_recycled_leader():
    t = terminal.spawn(terminal.with_ctty(["sh", "-c", "sleep 300 & echo bg=$!; wait"]), ENV)
    screen = Screen(t)
    try:
        bg = int(screen.expect(r"bg=(\d+)").group(1))
        start = procfs.read_stat(t.pid).start_time  # type: ignore[union-attr]
        terminal.end_sessions([(t.pid, start + 1)])  # not the leader recorded: nothing is killed
        assert procfs.read_stat(bg) is not None and not procfs.read_stat(bg).exited  # type: ignore[union-attr]
        terminal.end_sessions([(t.pid, start)])
        status = screen.finish()
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        wait_until(lambda: (st := procfs.read_stat(bg)) is None or st.exited, 5, "the background job's end")
    finally:
        screen.close()
