"""`yard shell` against a real `yard up` on the local backend (issue 38): the backend's terminal in
a running rank (backends/local/backend.py's `open_terminal`), through the API and the CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pytest

from tests.cli.yard_process import yard_process
from tests.plane import YARD

pytestmark = pytest.mark.xdist_group("terminal-yard-up")


@pytest.fixture(scope="module")
def yard(tmp_path_factory):
    yield from yard_process(tmp_path_factory, "shell")


@pytest.fixture(scope="module")
def job(yard) -> int:
    p = yard("submit", "--parsable", "-A", "vision", "-G", "2", "--", sys.executable, "-c",
             "import time; print('CG=' + open('/proc/self/cgroup').read().strip(), flush=True); time.sleep(1000)")
    job_id = int(p.stdout.strip().split(";")[0])
    deadline = time.monotonic() + 60
    while json.loads(yard("show", str(job_id), "--json").stdout)["state"] != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    probe = yard("shell", str(job_id), "--", "true", ok=False)
    if probe.returncode == 2 and "not available" in probe.stderr:
        pytest.skip(probe.stderr.strip())
    assert probe.returncode == 0, probe.stderr
    return job_id


def test_rank_1_environment_and_exit_status_in_a_pipe(yard, job: int) -> None:
    p = subprocess.run([YARD, "shell", str(job), "--rank", "1", "--", "sh", "-c", "echo R=$RANK J=$SLURM_JOB_ID; exit 5"],
                       capture_output=True, text=True, env=_env(yard), stdin=subprocess.DEVNULL, timeout=60)
    assert p.returncode == 5, p.stderr
    assert f"R=1 J={job}" in p.stdout


def test_the_shell_is_in_the_ranks_cgroup(yard, job: int) -> None:
    deadline = time.monotonic() + 20
    while "CG=" not in (log := yard("logs", str(job), "--rank", "1").stdout):
        assert time.monotonic() < deadline, log
        time.sleep(0.2)
    p = subprocess.run([YARD, "shell", str(job), "--rank", "1", "--", "cat", "/proc/self/cgroup"], capture_output=True,
                       text=True, env=_env(yard), stdin=subprocess.DEVNULL, timeout=60)
    assert p.returncode == 0, p.stderr
    rank = [x for x in log.split("CG=")[1].splitlines() if x[:1].isdigit()]  # cgroup lines: "N:controllers:/path"
    assert p.stdout.splitlines() == rank, (p.stdout, rank)


def test_ctrl_c_reaches_the_foreground_command_not_the_session(yard, job: int) -> None:
    child = pexpect.spawn(YARD, ["shell", str(job), "--", "env", "PS1=@@> ", "bash", "--norc", "--noprofile"],
                          env=_env(yard), timeout=30)
    child.expect_exact("@@> ")
    child.sendline("echo go''ne; sleep 1237")
    child.expect_exact("gone")
    wait_in_the_foreground("sleep 1237")
    child.sendcontrol("c")  # raw mode: the byte goes through; the remote line discipline makes it SIGINT
    child.expect_exact("@@> ")
    child.sendline("echo status=$?")
    child.expect_exact("status=130")  # the sleep was interrupted (128 + SIGINT)
    child.sendline("exit 3")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 3


def wait_in_the_foreground(cmdline: str, timeout: float = 30.0) -> None:
    """Until a process `cmdline` is its terminal's foreground process group: then one Ctrl-C, not
    the volley of tests/cli/test_shell.py's `interrupt` (one every half second until the prompt
    shows). Twice in full suite runs (stop 48) bash printed `status=130` and then no prompt, and
    `exit 3` waited for ever; not reproduced alone (80 runs beside four CPU hogs). The suspect is
    a second Ctrl-C reaching a loaded bash while it sets its prompt up: one, at the right time,
    tests what the test means (the foreground command gets it) without that race."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                if (stat.parent / "cmdline").read_bytes().split(b"\0")[:2] != cmdline.encode().split(b" ", 1):
                    continue
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[2] == fields[5]:  # pgrp == tpgid: the terminal's foreground group
                return
        time.sleep(0.05)
    raise AssertionError(f"no {cmdline!r} in the foreground of its terminal after {timeout:.0f}s")


def _env(yard) -> dict[str, str]:
    import os

    return {**os.environ, "YARD_URL": yard.server.url, "YARD_TOKEN": yard.server.token}
