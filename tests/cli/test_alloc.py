"""`yard alloc` on a real pseudo-terminal (pexpect) against a real `yard up` on the local backend
(issue 38, Deliver 1): the wait, the session's shell in the job as its owner, its exit ending the
allocation, `srun` across a 2-node allocation, Ctrl-C reaching the foreground command, Ctrl-C while
pending revoking the allocation, bad options.

One plane for the module, root, on a data dir every account may pass through; alice (team vision)
and bob (team nlp) are throwaway Unix accounts (tests/accounts.py) and their jobs run as them, so
"the shell runs as the owner, never root" is checked for real.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pexpect
import pytest

from tests.accounts import ROOT_ONLY, Accounts, shared_dir
from tests.cli.test_shell import interrupt
from tests.plane import YARD, YardServer
from tests.security.hostile import config_text, two_accounts

pytestmark = [pytest.mark.xdist_group("alloc-yard-up"), ROOT_ONLY]
PROMPT = "@@> "
SET_PROMPT = "PS1='@''@> '"  # the echoed line is not the prompt
GRACE_S = 4


class Yard:
    """The module's plane: its URL, the admin's API client, alice's and bob's tokens, their homes.
    `yard` commands run as alice (her token, in her home) unless told otherwise."""

    def __init__(self, server: YardServer, acc: Accounts, base: Path, tokens: dict[str, str]):
        self.server, self.acc, self.base, self.tokens = server, acc, base, tokens
        self.home = base / "home-alice"
        self.children: list[pexpect.spawn] = []
        self.api = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=30)

    def env(self, token: str | None = None) -> dict[str, str]:
        return {**os.environ, "YARD_URL": self.server.url, "YARD_TOKEN": token or self.tokens["alice"]}

    def run(self, *args: str, token: str | None = None, **kw: Any) -> subprocess.CompletedProcess:
        return subprocess.run([YARD, *args], capture_output=True, text=True, env=self.env(token), timeout=60,
                              stdin=subprocess.DEVNULL, cwd=kw.pop("cwd", self.home), **kw)

    def spawn(self, *args: str, token: str | None = None) -> pexpect.spawn:
        child = pexpect.spawn(YARD, list(args), env=self.env(token), cwd=str(self.home), dimensions=(24, 100),
                              timeout=60, encoding="utf-8", codec_errors="replace")
        self.children.append(child)
        return child

    def job(self, job_id: int) -> dict:
        return self.api.get(f"/api/v1/jobs/{job_id}").json()

    def free_gpus(self) -> int:
        return sum(n["gpus_free"] for n in self.api.get("/api/v1/nodes").json()["nodes"])

    def jobs(self, active: bool = True) -> list[dict]:
        """The jobs not ended (`active`), or all."""
        return self.api.get("/api/v1/jobs", params={"active": "true"} if active else {}).json()["jobs"]


@pytest.fixture(scope="module")
def yard() -> Iterator[Yard]:
    with two_accounts() as acc, shared_dir("ty-alloc-") as d:
        cfg = d / "cluster.yaml"
        cfg.write_text(config_text(acc) + f"interactive:\n  connection_grace: {GRACE_S}\n")
        (d / "yard").mkdir()
        server = YardServer(d / "yard", config_file=cfg)
        server.start()
        api = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=30)
        tokens = {}
        for user, team, group in (("alice", "vision", "vis"), ("bob", "nlp", "nlp")):
            (d / f"home-{user}").mkdir()
            os.chown(d / f"home-{user}", acc.uid(user), acc.gid(group))
            tokens[user] = api.post("/api/v1/tokens", json={"user": user, "role": "member", "team": team}).json()["token"]
        y = Yard(server, acc, d, tokens)
        try:
            yield y
        finally:
            for j in y.jobs():
                api.post(f"/api/v1/jobs/{j['id']}/cancel")
            time.sleep(1)
            server.terminate()


@pytest.fixture(autouse=True)
def nothing_left(yard: Yard) -> Iterator[None]:
    """After each test: its `yard alloc`s gone and every job ended, so that a failed test leaves
    no allocation holding the GPUs the next one needs."""
    yield
    for child in yard.children:
        child.close(force=True)
    yard.children.clear()
    for j in yard.jobs():
        yard.api.post(f"/api/v1/jobs/{j['id']}/cancel")
    deadline = time.monotonic() + 20
    while yard.jobs() and time.monotonic() < deadline:
        time.sleep(0.1)


def granted(child: pexpect.spawn) -> int:
    """The allocation's id, once `yard alloc` says its nodes are ready."""
    child.expect(r"salloc: Granted job allocation (\d+)")
    job_id = int(child.match.group(1))
    child.expect_exact("are ready for job")
    return job_id


def wait_state(y: Yard, job_id: int, states: tuple[str, ...], within: float = 30) -> dict:
    deadline = time.monotonic() + within
    while (j := y.job(job_id))["state"] not in states:
        assert time.monotonic() < deadline, j
        time.sleep(0.05)
    return j


def test_alloc_gives_the_owners_shell_with_the_jobs_environment_and_exit_frees_the_gpu(yard: Yard) -> None:
    free = yard.free_gpus()
    t0 = time.monotonic()
    child = yard.spawn("alloc", "-G", "1")
    job_id = granted(child)
    child.sendline(SET_PROMPT)
    child.expect_exact(PROMPT)
    prompt_s = time.monotonic() - t0
    child.sendline("echo J=$SLURM_JOB_ID C=$CUDA_VISIBLE_DEVICES; id -un")
    child.expect(r"J=(\d+) C=(\S+)\r\n(\S+)\r\n")
    assert int(child.match.group(1)) == job_id
    assert re.fullmatch(r"\d+", child.match.group(2)), child.match.group(2)  # one GPU's index
    assert child.match.group(3) == yard.acc.user("alice")  # the owner, not root (the plane is root)
    j = yard.job(job_id)
    assert j["state"] == "RUNNING" and j["interactive"]["kind"] == "alloc" and j["class"] == "interactive"
    assert yard.free_gpus() == free - 1
    t_exit = time.monotonic()
    child.sendline("exit")
    child.expect_exact(f"salloc: Relinquishing job allocation {job_id}")
    # the plane ends the job (COMPLETED, exit 0) and frees its GPU within 2 s of the `exit`
    while (j := yard.job(job_id))["state"] != "COMPLETED" or yard.free_gpus() != free:
        assert time.monotonic() - t_exit < 2.0, (j["state"], j["reason"], yard.free_gpus(), free)
        time.sleep(0.02)
    freed_s = time.monotonic() - t_exit
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert j["exit_code"] in (0, None), j
    print(f"\nyard alloc to prompt: {prompt_s:.2f}s; exit to COMPLETED and GPU free: {freed_s:.2f}s")


def _two_node_srun(yard: Yard, step: str) -> tuple[list[str], list[str]]:
    """In a `yard alloc -N 2` session, `srun STEP` (its lines, sorted) and the allocation's nodes."""
    child = yard.spawn("alloc", "-N", "2", "--gpus-per-node", "1")
    job_id = granted(child)
    names = sorted(p["node"] for p in yard.job(job_id)["placement"])
    assert len(names) == 2, names
    child.sendline(SET_PROMPT)
    child.expect_exact(PROMPT)
    child.sendline(f"echo N=$SLURM_JOB_NODELIST; srun {step} | sort; echo do''ne")
    child.expect(r"N=(\S+)\r\n(.*?)\r\ndone", timeout=60)
    lines = child.match.group(2).split("\r\n")
    child.expect_exact(PROMPT)
    child.sendline("exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    return lines, names


def test_srun_in_a_two_node_allocation_starts_a_task_on_each_node(yard: Yard) -> None:
    lines, names = _two_node_srun(yard, "printenv SLURMD_NODENAME")
    assert lines == names


def test_srun_hostname_in_a_two_node_allocation_prints_both_nodes(yard: Yard) -> None:
    lines, names = _two_node_srun(yard, "hostname")
    assert lines == names


def test_ctrl_c_reaches_the_foreground_command_and_the_shells_status_is_the_jobs(yard: Yard) -> None:
    child = yard.spawn("alloc", "-G", "1")
    job_id = granted(child)
    child.sendline(SET_PROMPT)
    child.expect_exact(PROMPT)
    # Ctrl-C reaches the foreground command, not the session nor `yard alloc`
    child.sendline("echo go''ne; sleep 100")
    child.expect_exact("gone")
    interrupt(child)
    child.sendline("echo status=$?")
    child.expect_exact("status=130")
    assert yard.job(job_id)["state"] == "RUNNING"
    child.sendline("exit 3")  # the shell's status is yard alloc's, and the job's exit code
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 3
    j = wait_state(yard, job_id, ("FAILED", "COMPLETED"), within=10)
    assert j["state"] == "FAILED" and j["exit_code"] == 3, j


@pytest.fixture()
def node0_busy(yard: Yard) -> Iterator[int]:
    """node-0's four GPUs held by another team's job that cannot be preempted (interactive class)."""
    p = yard.run("submit", "--parsable", "-q", "interactive", "--gpus-per-node", "4", "-w", "node-0", "--",
                 "sleep", "1000", token=yard.tokens["bob"], cwd=yard.base / "home-bob")
    assert p.returncode == 0, p.stderr
    blocker = int(p.stdout.strip())
    wait_state(yard, blocker, ("RUNNING",))
    yield blocker
    yard.api.post(f"/api/v1/jobs/{blocker}/cancel")
    wait_state(yard, blocker, ("CANCELLED",))


def test_ctrl_c_while_pending_revokes_the_allocation(yard: Yard, node0_busy: int) -> None:
    child = yard.spawn("alloc", "--gpus-per-node", "4", "-w", "node-0")
    child.expect(r"salloc: Pending job allocation (\d+)")
    job_id = int(child.match.group(1))
    child.expect(rf"\r\x1b\[Ksalloc: job {job_id} PENDING \((\w+)\)")  # the live line, redrawn in place
    assert yard.job(job_id)["state"] == "PENDING"
    child.sendcontrol("c")
    child.expect_exact(f"salloc: Job allocation {job_id} has been revoked.")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    assert yard.job(job_id)["state"] == "CANCELLED"


def test_sigterm_while_pending_revokes_and_a_pipe_gets_plain_lines(yard: Yard, node0_busy: int) -> None:
    p = subprocess.Popen([YARD, "alloc", "--gpus-per-node", "4", "-w", "node-0"], env=yard.env(),
                         cwd=yard.home, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    assert p.stderr is not None
    first = p.stderr.readline()
    job_id = int(re.fullmatch(r"salloc: Pending job allocation (\d+)\n", first).group(1))  # type: ignore[union-attr]
    status = p.stderr.readline()
    assert status.startswith(f"salloc: job {job_id} PENDING"), status
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 1, err
    assert f"salloc: Job allocation {job_id} has been revoked." in err
    assert "\r" not in first + status + err
    assert yard.job(job_id)["state"] == "CANCELLED"


def test_an_allocation_cancelled_before_it_runs_is_reported_with_its_state(yard: Yard, node0_busy: int) -> None:
    p = subprocess.Popen([YARD, "alloc", "--gpus-per-node", "4", "-w", "node-0"], env=yard.env(),
                         cwd=yard.home, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    assert p.stderr is not None
    job_id = int(p.stderr.readline().split()[-1])
    assert yard.run("cancel", str(job_id)).returncode == 0
    out, err = p.communicate(timeout=30)
    assert p.returncode == 1, err
    assert re.search(rf"salloc: error: Job allocation {job_id} ended before its session began: CANCELLED", err), err


def test_bad_options_exit_2_naming_the_option_and_submit_nothing(yard: Yard) -> None:
    before = len(yard.jobs(active=False))
    for args, named in ((["-G", "two"], "--gpus"), (["--output", "x.log"], "--output"), (["-t", "soon"], "time"),
                        (["-q", "no-such-class"], "class")):
        p = yard.run("alloc", *args)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert p.stderr.startswith("error: ") and named in p.stderr, (args, p.stderr)
    assert len(yard.jobs(active=False)) == before


def test_alloc_runs_a_command_given_after_dashdash_and_exits_with_its_status(yard: Yard) -> None:
    p = yard.run("alloc", "-G", "1", "--", "sh", "-c", "echo id=$SLURM_JOB_ID; exit 7")
    assert p.returncode == 7, p.stderr
    job_id = int(re.search(r"Granted job allocation (\d+)", p.stderr).group(1))  # type: ignore[union-attr]
    assert f"id={job_id}" in p.stdout
    assert wait_state(yard, job_id, ("FAILED",), within=10)["exit_code"] == 7
    assert json.loads(yard.run("show", str(job_id), "--json").stdout)["interactive"]["exit"] == 7


def test_sighup_during_the_session_relinquishes_the_allocation_at_once(yard: Yard) -> None:
    child = yard.spawn("alloc", "-G", "1")
    job_id = granted(child)
    child.sendline(SET_PROMPT)
    child.expect_exact(PROMPT)
    child.kill(signal.SIGHUP)  # the terminal closed: salloc relinquishes, it does not wait for a grace
    child.expect_exact(f"salloc: Relinquishing job allocation {job_id}")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 128 + signal.SIGHUP, (child.exitstatus, child.signalstatus)
    j = wait_state(yard, job_id, ("COMPLETED", "FAILED", "CANCELLED"), within=GRACE_S - 1)
    assert j["state"] == "COMPLETED" and j["reason"] != "ConnectionLost", j
