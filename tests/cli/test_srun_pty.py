"""`yard srun --pty CMD` against a real `yard up` on the local backend (issue 38, Deliver 2): an
allocation and one interactive step in one go, CMD's status its exit status and the job's exit code;
without `--pty` it is refused, pointing to `yard submit`.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pexpect
import pytest

from tests.cli.yard_process import yard_process
from tests.plane import YARD

pytestmark = pytest.mark.xdist_group("srun-pty-yard-up")


@pytest.fixture(scope="module")
def yard(tmp_path_factory):
    yield from yard_process(tmp_path_factory, "srun-pty")


def _env(yard) -> dict[str, str]:
    import os

    return {**os.environ, "YARD_URL": yard.server.url, "YARD_TOKEN": yard.server.token}


def _ended(yard, job_id: int) -> dict:
    deadline = time.monotonic() + 10
    while (j := json.loads(yard("show", str(job_id), "--json").stdout))["state"] in ("RUNNING", "COMPLETING"):
        assert time.monotonic() < deadline, j
        time.sleep(0.1)
    return j


def test_srun_pty_exits_with_the_commands_status_and_the_job_fails_with_it(yard) -> None:
    child = pexpect.spawn(YARD, ["srun", "--pty", "-G", "1", "-A", "vision", "bash", "-c",
                                 "echo on $SLURM_JOB_ID; test -t 0 && echo a-tty; exit 3"],
                          env=_env(yard), cwd=str(yard.server.data_dir), timeout=60, encoding="utf-8")
    child.expect(r"srun: Granted job allocation (\d+)")
    job_id = int(child.match.group(1))
    child.expect_exact(f"on {job_id}")
    child.expect_exact("a-tty")  # the step has a terminal: --pty
    child.expect_exact(f"srun: Relinquishing job allocation {job_id}")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 3
    j = _ended(yard, job_id)
    assert j["state"] == "FAILED" and j["exit_code"] == 3, j
    assert j["interactive"] == {"kind": "srun", "exit": 3}, j["interactive"]


def test_srun_pty_in_a_pipe_carries_stdin_and_exits_0(yard) -> None:
    p = subprocess.run([YARD, "srun", "--pty", "-G", "1", "-A", "vision", "--", "sh", "-c", "read x; echo got=$x"],
                       input="hello\n", capture_output=True, text=True, env=_env(yard), cwd=yard.server.data_dir,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert "got=hello" in p.stdout
    job_id = int(re.search(r"srun: Granted job allocation (\d+)", p.stderr).group(1))  # type: ignore[union-attr]
    assert _ended(yard, job_id)["state"] == "COMPLETED"


def test_srun_without_pty_or_command_is_refused_with_exit_2(yard) -> None:
    before = len(json.loads(yard("queue", "-t", "all", "--json").stdout))
    p = yard("srun", "-G", "1", "-A", "vision", "--", "hostname", ok=False)
    assert p.returncode == 2 and "--pty" in p.stderr and "yard submit" in p.stderr, p.stderr
    p = yard("srun", "--pty", "-G", "1", ok=False)
    assert p.returncode == 2 and "give the command" in p.stderr, p.stderr
    p = yard("srun", "--pty", "--gpus", "lots", "bash", ok=False)
    assert p.returncode == 2 and "--gpus" in p.stderr, p.stderr
    assert len(json.loads(yard("queue", "-t", "all", "--json").stdout)) == before
