"""`yard shell JOB` on a real pseudo-terminal (pexpect), against a real server (issue 38).

The server is the fake plane under uvicorn (tests/api/terminal_plane.py): its backend's terminal
is a real pty running the command, so the raw mode, Ctrl-C, SIGWINCH and the exit status go the
whole way: local pty → `yard shell` → WebSocket → API → remote pty → bash, and back.
"""

from __future__ import annotations

import os
import subprocess

import pexpect
import pytest

from tests.api import terminal_plane
from tests.plane import YARD

PROMPT = "@@> "
BASH = ["env", f"PS1={PROMPT}", "bash", "--norc", "--noprofile"]

pytestmark = pytest.mark.xdist_group("terminal-cli")  # one plane and server per module


@pytest.fixture(scope="module")
def t(tmp_path_factory):
    served, server, thread = terminal_plane.serve(tmp_path_factory.mktemp("shell") / "d")
    yield served
    terminal_plane.stop(served, server, thread)


def interrupt(child: pexpect.spawn, prompt: str = "@@> ") -> None:
    """Ctrl-C until the prompt is back: one sent before the shell has started the command is
    the shell's, not the command's (a race of the test, not of the terminal)."""
    for _ in range(20):
        child.sendcontrol("c")
        if child.expect_exact([prompt, pexpect.TIMEOUT], timeout=0.5) == 0:
            return
    raise AssertionError("Ctrl-C did not bring the prompt back")


def _env(t: terminal_plane.Served, token: str) -> dict[str, str]:
    return {**os.environ, "YARD_URL": t.url, "YARD_TOKEN": token}


def _spawn(t: terminal_plane.Served, *args: str, token: str | None = None) -> pexpect.spawn:
    child = pexpect.spawn(YARD, ["shell", *args], env=_env(t, token or t.alice), dimensions=(24, 80), timeout=20)
    return child


def test_a_prompt_echo_resize_ctrl_c_ctrl_z_and_the_exit_status(t) -> None:
    child = _spawn(t, str(t.running), "--", *BASH)
    child.expect_exact(PROMPT)
    child.sendline("echo hel''lo $MARK")  # the quotes: the output, not the echoed line, is matched
    child.expect_exact("hello x42")
    child.expect_exact(PROMPT)
    child.setwinsize(37, 111)  # SIGWINCH to `yard shell`, a resize message, TIOCSWINSZ there
    child.sendline("stty size")
    child.expect_exact("37 111")
    child.expect_exact(PROMPT)
    child.sendline("echo go''ne; sleep 100")
    child.expect_exact("gone")
    interrupt(child)  # raw mode: the byte goes through; the remote line discipline makes it SIGINT
    child.sendline("echo status=$?")
    child.expect_exact("status=130")  # the sleep was interrupted (128 + SIGINT)
    child.sendline("echo go''ne2; sleep 200")
    child.expect_exact("gone2")
    for _ in range(20):  # Ctrl-Z: the foreground command stops, the shell takes the terminal back
        child.sendcontrol("z")
        if child.expect_exact(["Stopped", pexpect.TIMEOUT], timeout=0.5) == 0:
            break
    child.expect_exact(PROMPT)
    child.sendline("kill -9 %1; wait; echo still''here")
    child.expect_exact("stillhere")
    child.sendline("exit 3")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 3


def test_the_local_terminal_is_restored(t) -> None:
    child = pexpect.spawn("/bin/sh", ["-c", f"stty -g; {YARD} shell {t.running} -- true; stty -g"],
                          env=_env(t, t.alice), timeout=20)
    child.expect(pexpect.EOF)
    lines = [x for x in child.before.decode().split("\r\n") if ":" in x]
    assert len(lines) == 2 and lines[0] == lines[1], lines


def test_rank_1(t) -> None:
    child = _spawn(t, str(t.running), "--rank", "1", "--", "sh", "-c", "echo rank=$RANK")
    child.expect_exact("rank=1")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_plain_pipes_for_scripts(t) -> None:
    p = subprocess.run([YARD, "shell", str(t.running), "--", "sh"], input="echo piped-$MARK\nexit 4\n",
                       capture_output=True, text=True, env=_env(t, t.alice), timeout=30)
    assert p.returncode == 4, p.stderr
    assert "piped-x42" in p.stdout and "echo" not in p.stdout  # no echo of the input in a pipe
    p = subprocess.run([YARD, "shell", str(t.running), "--", "cat"], input="no newline at the end",
                       capture_output=True, text=True, env=_env(t, t.alice), timeout=30)
    assert p.returncode == 0 and "no newline at the end" in p.stdout, p


@pytest.mark.parametrize("who, job, says", [("nora", "running", "only its owner"), ("alice", "pending", "not RUNNING"),
                                            ("alice", 99999, "no job 99999")])
def test_refusals_are_one_line_and_exit_2(t, who: str, job, says: str) -> None:
    job_id = getattr(t, job) if isinstance(job, str) else job
    p = subprocess.run([YARD, "shell", str(job_id)], capture_output=True, text=True, env=_env(t, getattr(t, who)),
                       timeout=30, stdin=subprocess.DEVNULL)
    assert p.returncode == 2, p
    assert p.stderr.startswith("error: ") and says in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_an_unreachable_server_is_exit_1(t) -> None:
    p = subprocess.run([YARD, "shell", str(t.running)], capture_output=True, text=True, timeout=30,
                       env={**_env(t, t.alice), "YARD_URL": "http://127.0.0.1:9"}, stdin=subprocess.DEVNULL)
    assert p.returncode == 1 and p.stderr.startswith("error: cannot reach"), p
