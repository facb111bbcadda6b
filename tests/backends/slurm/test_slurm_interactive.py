"""Interactive work on the real 2-node Slurm test cluster (tests/slurm_cluster.py, issue 38: "works
the same on the real Slurm test cluster"): a real root `yard up --backend slurm`, driven through
the `yard` CLI on real pseudo-terminals (pexpect) as alice, a throwaway Unix account with a member
token of team vision (tests/accounts.py), whose jobs Slurm runs as her.

- `yard alloc -N 2`: the prompt, the allocation's environment (Slurm's own SLURM_JOB_ID, which its
  `srun` needs; trainyard's in TRAINYARD_JOB_ID), the owner; a plain `srun` starts one task on each
  node, as in salloc's interactive step; `exit` ends the job COMPLETED and gone from `squeue`
  (the times are printed);
- `yard srun --pty -N 1 bash -c 'exit 3'` exits 3 and the job is FAILED with 3;
- `yard shell` into a running 2-rank job lands on rank 1's node, as the owner;
- `yard port-forward` reaches an HTTP server in a Slurm job (the relay, a step of the job's);
- a `yard alloc` killed with -9 leaves the allocation CANCELLED ConnectionLost after the grace,
  nothing of it left in `squeue`.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pexpect
import pytest

from tests.accounts import ROOT_ONLY, Accounts, shared_dir
from tests.plane import YARD, YardServer
from tests.security.hostile import two_accounts
from tests.slurm_cluster import SlurmCluster, slurm_available
from tests.yard_cluster import SLURM_TWO_TEAMS
from trainyard.backends.rundir import job_tools

pytestmark = [ROOT_ONLY, pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm-interactive")]
PROMPT = "@@> "
SET_PROMPT = "PS1='@''@> '"  # the echoed line is not the prompt
GRACE_S = 4


@dataclass
class Site:
    cluster: SlurmCluster
    server: YardServer
    acc: Accounts
    base: Path
    api: httpx.Client  # the admin's
    alice: str  # alice's member token (team vision)
    children: list[pexpect.spawn] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.base / "home-alice"

    def env(self) -> dict[str, str]:
        return {**os.environ, "YARD_URL": self.server.url, "YARD_TOKEN": self.alice}

    def spawn(self, *args: str) -> pexpect.spawn:
        child = pexpect.spawn(YARD, list(args), env=self.env(), cwd=str(self.home), dimensions=(24, 160),
                              timeout=90, encoding="utf-8", codec_errors="replace")
        self.children.append(child)
        return child

    def job(self, job_id: int) -> dict:
        return self.api.get(f"/api/v1/jobs/{job_id}").json()

    def wait(self, job_id: int, states: tuple[str, ...], within: float = 60) -> dict:
        deadline = time.monotonic() + within
        while (j := self.job(job_id))["state"] not in states:
            assert time.monotonic() < deadline, j
            time.sleep(0.05)
        return j

    def squeue(self) -> list[str]:
        """Slurm's jobs still there (pending, running, completing): `id comment`."""
        out = self.cluster.run("squeue", "-h", "-o", "%i %T %k").stdout
        return [x for x in out.splitlines() if x.strip()]

    def slurm_id(self, job_id: int, within: float = 30) -> int:
        """The Slurm id of the job's attempt. The store says RUNNING from the commit that starts an
        attempt; the launch thread's sbatch comes after it, so it is waited for."""
        deadline = time.monotonic() + within
        while True:
            lines = self.squeue()
            for line in lines:
                if f"trainyard job {job_id} attempt" in line:
                    return int(line.split()[0])
            assert time.monotonic() < deadline, f"job {job_id} not in squeue: {lines}"
            time.sleep(0.1)


def _config(acc: Accounts) -> str:
    text = SLURM_TWO_TEAMS.read_text()
    text = text.replace("  - name: vision\n", f"  - name: vision\n    group: {acc.group('vis')}\n")
    text = text.replace("  - name: nlp\n", f"  - name: nlp\n    group: {acc.group('nlp')}\n")
    return text + (f"interactive:\n  connection_grace: {GRACE_S}\n"
                   f"users:\n  alice: {acc.user('alice')}\n  bob: {acc.user('bob')}\n")


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    reason = slurm_available()
    if reason:
        pytest.skip(reason)
    if job_tools.default_python() == sys.executable:
        pytest.skip("no host python3 for the rank wrapper (job_python) other than the plane's own")
    with two_accounts() as acc, shared_dir("ty-slurm-ia-") as d:
        os.chmod(d, 0o755)
        cluster = SlurmCluster(d / "slurm").start()
        try:
            cfg = d / "cluster.yaml"
            cfg.write_text(_config(acc))
            home = d / "home-alice"
            home.mkdir()
            os.chown(home, acc.uid("alice"), acc.gid("vis"))
            (d / "yard").mkdir()
            server = YardServer(d / "yard", config_file=cfg, args=("--backend", "slurm"),
                                env={**os.environ, **cluster.env(), "OMP_NUM_THREADS": "1"})
            api = server.start()
            try:
                alice = api.post("/api/v1/tokens", json={"user": "alice", "role": "member", "team": "vision"}).json()["token"]
                yield Site(cluster, server, acc, d, api, alice)
            finally:
                for j in api.get("/api/v1/jobs", params={"active": "true"}).json()["jobs"]:
                    api.post(f"/api/v1/jobs/{j['id']}/cancel")
                time.sleep(1)
                server.terminate()
        finally:
            cluster.stop()


@pytest.fixture(autouse=True)
def nothing_left(site: Site) -> Iterator[None]:
    """After each test: its clients gone, every job ended and Slurm empty, so that the next test
    has both nodes."""
    yield
    for child in site.children:
        child.close(force=True)
    site.children.clear()
    for j in site.api.get("/api/v1/jobs", params={"active": "true"}).json()["jobs"]:
        site.api.post(f"/api/v1/jobs/{j['id']}/cancel")
    deadline = time.monotonic() + 30
    while (site.api.get("/api/v1/jobs", params={"active": "true"}).json()["jobs"] or site.squeue()) \
            and time.monotonic() < deadline:
        time.sleep(0.2)


def granted(child: pexpect.spawn, what: str = "salloc") -> int:
    child.expect(rf"{what}: Granted job allocation (\d+)")
    job_id = int(child.match.group(1))
    child.expect_exact("are ready for job")
    return job_id


def gone_from_squeue(site: Site, slurm_id: int, since: float, within: float = 20) -> float:
    while any(line.split()[0] == str(slurm_id) for line in site.squeue()):
        assert time.monotonic() - since < within, site.squeue()
        time.sleep(0.05)
    return time.monotonic() - since


def test_alloc_two_nodes_the_allocations_environment_srun_on_both_and_exit_completes(site: Site) -> None:
    t0 = time.monotonic()
    child = site.spawn("alloc", "-N", "2", "--gpus-per-node", "1")
    job_id = granted(child)
    child.sendline(SET_PROMPT)
    child.expect_exact(PROMPT)
    prompt_s = time.monotonic() - t0
    slurm_id = site.slurm_id(job_id)
    child.sendline("echo J=$SLURM_JOB_ID Y=$TRAINYARD_JOB_ID N=$SLURM_NNODES T=$SLURM_NTASKS L=$SLURM_JOB_NODELIST "
                   "S=${SLURM_STEP_ID-unset} C=$CUDA_VISIBLE_DEVICES D=$PWD; id -un")
    child.expect(r"J=(\d+) Y=(\d+) N=(\S+) T=(\S+) L=(\S+) S=(\S+) C=(\S*) D=(\S+)\r\n(\S+)\r\n")
    got = child.match.groups()
    assert got[:6] == (str(slurm_id), str(job_id), "2", "2", "n[1-2]", "unset"), got
    assert re.fullmatch(r"\d+", got[6]) and got[7] == str(site.home), got  # the first node's GPU; the workdir
    assert got[8] == site.acc.user("alice"), got  # the owner, never root (the plane is root)
    child.expect_exact(PROMPT)
    # salloc's interactive step: a plain srun starts a task on each node of the allocation
    child.sendline("srun bash -c 'echo t''ask-$SLURM_PROCID-of-$SLURM_NTASKS on $SLURMD_NODENAME as $(id -un)' | sort; "
                   "echo do''ne")
    child.expect(r"(task-[\s\S]*?)\r\ndone", timeout=60)
    user = site.acc.user("alice")
    assert child.match.group(1).split("\r\n") == [f"task-0-of-2 on n1 as {user}", f"task-1-of-2 on n2 as {user}"]
    child.expect_exact(PROMPT)
    t_exit = time.monotonic()
    child.sendline("exit")
    child.expect_exact(f"salloc: Relinquishing job allocation {job_id}")
    j = site.wait(job_id, ("COMPLETED", "FAILED", "CANCELLED"), within=30)
    completed_s = time.monotonic() - t_exit
    assert j["state"] == "COMPLETED" and j["interactive"] == {"kind": "alloc", "exit": 0}, j
    squeue_s = gone_from_squeue(site, slurm_id, t_exit)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    print(f"\nSlurm: yard alloc -N 2 to prompt {prompt_s:.2f}s; exit to COMPLETED {completed_s:.2f}s, "
          f"to gone from squeue {squeue_s:.2f}s")


def test_srun_pty_exit_3_is_the_commands_and_the_jobs(site: Site) -> None:
    child = site.spawn("srun", "--pty", "-N", "1", "bash", "-c", "echo as-$(id -un); exit 3")
    job_id = granted(child, "srun")
    child.expect(r"as-(\S+)\r\n")
    assert child.match.group(1) == site.acc.user("alice")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 3
    j = site.wait(job_id, ("COMPLETED", "FAILED", "CANCELLED"), within=30)
    assert (j["state"], j["exit_code"], j["interactive"]) == ("FAILED", 3, {"kind": "srun", "exit": 3}), j


def _submit(site: Site, *args: str) -> int:
    p = subprocess.run([YARD, "submit", "--parsable", "-A", "vision", *args], env=site.env(), cwd=site.home,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return int(p.stdout.strip().split(";")[0])


def test_shell_into_rank_1_of_a_running_two_rank_job_is_on_its_node_as_the_owner(site: Site) -> None:
    job_id = _submit(site, "-N", "2", "--gpus-per-node", "1", "--", "sleep", "600")
    site.wait(job_id, ("RUNNING",))
    slurm_id = site.slurm_id(job_id)
    p = subprocess.run([YARD, "shell", str(job_id), "--rank", "1", "--", "sh", "-c",
                        "echo J=$SLURM_JOB_ID on=$SLURMD_NODENAME as=$(id -un); exit 4"],
                       env=site.env(), capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=90)
    assert p.returncode == 4, p.stderr
    assert f"J={slurm_id} on=n2 as={site.acc.user('alice')}" in p.stdout, p.stdout
    assert site.job(job_id)["state"] == "RUNNING"  # a shell's exit ends nothing


SERVER = "import http.server, sys; http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), " \
         "http.server.SimpleHTTPRequestHandler).serve_forever()"


def test_port_forward_reaches_an_http_server_in_a_slurm_job(site: Site) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    page = site.home / "page.txt"
    page.write_text("served from the job\n" * 2000)  # 40 KB: more than one pipe's worth
    os.chown(page, site.acc.uid("alice"), site.acc.gid("vis"))
    job_id = _submit(site, "-G", "1", "--", "/usr/bin/python3", "-c", SERVER, str(port))
    site.wait(job_id, ("RUNNING",))
    p = subprocess.Popen([YARD, "port-forward", str(job_id), f":{port}"], env=site.env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline() if p.stdout else ""
        assert line.startswith("Forwarding from 127.0.0.1:"), (line, p.stderr.read() if p.stderr else "")
        local = int(line.split("127.0.0.1:")[1].split()[0])
        deadline = time.monotonic() + 60
        while True:  # the server may still be starting: the first connections are refused
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{local}/page.txt", timeout=30) as r:
                    body = r.read().decode()
                break
            except OSError as e:
                assert time.monotonic() < deadline, e
                time.sleep(0.5)
        assert body == page.read_text()
        t0 = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{local}/page.txt", timeout=30) as r:
            assert r.read().decode() == body
        print(f"\nSlurm: a request through the forwarded port (a new srun relay): {time.monotonic() - t0:.2f}s")
    finally:
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=20)
    assert p.returncode == 0, err
    events = site.api.get(f"/api/v1/jobs/{job_id}/events").json()["events"]
    assert any(e["kind"] == "job.port_forward" and e["data"]["port"] == port for e in events), events


def test_a_killed_alloc_client_ends_the_allocation_after_the_grace_and_slurm_lets_it_go(site: Site) -> None:
    child = site.spawn("alloc", "-G", "1")
    job_id = granted(child)
    child.sendline(SET_PROMPT)
    child.expect_exact(PROMPT)
    slurm_id = site.slurm_id(job_id)
    os.kill(child.pid, signal.SIGKILL)  # the laptop goes: no release, no close frame
    left = time.monotonic()
    time.sleep(GRACE_S - 1.5)
    assert site.job(job_id)["state"] == "RUNNING"
    j = site.wait(job_id, ("COMPLETED", "FAILED", "CANCELLED"), within=GRACE_S + 20)
    assert (j["state"], j["reason"]) == ("CANCELLED", "ConnectionLost"), j
    gone_from_squeue(site, slurm_id, left, within=GRACE_S + 40)
    lost = [e for e in site.api.get(f"/api/v1/jobs/{job_id}/events").json()["events"]
            if e["kind"] == "job.connection_lost"]
    assert len(lost) == 1 and f"{GRACE_S}s" in lost[0]["message"], lost
