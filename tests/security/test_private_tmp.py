"""Attacks through /tmp and /dev/shm (issue 34 point 3): what a job leaves there outlives it and
eats the host's RAM (198 MB stayed after an OOM-killed 200 MB job), another account's job or the
host reads it, and a job reads what others left there. Defence: a tmpfs per attempt and node,
bound on /tmp and /dev/shm in a mount namespace of the job's own (as Slurm's job_container/tmpfs
and systemd's PrivateTmp), sized by --mem and charged to it, unmounted at release.

A root plane in this process, real accounts (tests/accounts.py): alice of team vision, bob of
nlp. The data dir is under the host's /tmp (tests/accounts.py's shared dir), as a scratch
checkout would be: its top directory stays reachable in the jobs' namespaces, nothing else of
the host's /tmp does.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.accounts import ROOT_ONLY, Accounts
from tests.plane import Plane, job_dir
from tests.security.hostile import root_plane, two_accounts

pytestmark = ROOT_ONLY


@pytest.fixture(scope="module")
def acc() -> Iterator[Accounts]:
    with two_accounts() as a:
        yield a


@pytest.fixture(scope="module")
def plane(acc: Accounts) -> Iterator[Plane]:
    with root_plane(acc, "ty-tmp-") as p:
        assert p.cp.backend._tmp.mode == "tmpfs", p.cp.backend.containment_line
        yield p


def log_of(p: Plane, job: int, rank: int = 0) -> str:
    try:
        return (job_dir(p.cp.data_dir, job) / "logs" / f"rank-{rank}.log").read_text()
    except (FileNotFoundError, AssertionError):
        return ""


def wait_log(p: Plane, job: int, text: str, rank: int = 0, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while text not in (log := log_of(p, job, rank)):
        assert time.monotonic() < deadline, log
        time.sleep(0.05)
    return log


def tmp_dirs(p: Plane, job: int) -> list[str]:
    """The job's private tmp directories under the data dir (one per node of its attempt; the
    plane's own mount of each is detached once the ranks hold it), until its release."""
    return [n for n in os.listdir(p.cp.data_dir / "tmp") if n.startswith(f"j{job}.a")]


def shmem_mb() -> float:
    """The host's tmpfs and shared memory in RAM (/proc/meminfo's Shmem, what `free` calls shared)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no Shmem in /proc/meminfo")


def wait_gone(p: Plane, job: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while tmp_dirs(p, job):
        assert time.monotonic() < deadline, f"job {job}'s private tmp is still there: {tmp_dirs(p, job)}"
        time.sleep(0.05)


def test_another_accounts_job_and_the_host_see_nothing_of_a_jobs_tmp_and_its_ranks_share_it(plane, acc):
    p, tag = plane, acc.prefix
    host_file = Path(f"/tmp/host-{tag}")
    host_file.write_text("the host's\n")
    host_file.chmod(0o644)
    try:
        alice = p.as_user("alice", "member", "vision")
        # Two ranks on one node: each writes its /dev/shm file and waits for the other's (as NCCL's
        # shared-memory transport and torch's FileStore need); rank 0 writes /tmp too.
        a = p.submit(alice, nodes=1, gpus_per_node=2, command=["/bin/sh", "-c", (
            f'echo "TMPDIR=$TMPDIR"; [ "$RANK" = 0 ] && echo alices-{tag} > /tmp/x-{tag}; echo "$RANK" > /dev/shm/y-{tag}-$RANK; '
            f'until [ -e /dev/shm/y-{tag}-0 ] && [ -e /dev/shm/y-{tag}-1 ]; do sleep 0.05; done; '
            f'echo "both: $(cat /dev/shm/y-{tag}-0 /dev/shm/y-{tag}-1 | tr "\\n" " ")"; '
            f'cat {host_file} 2>&1 | sed "s/^/host: /"; echo "dev: $(stat -c %d /dev/shm)"; echo ready; '
            'exec sleep 120')])["id"]
        devs = set()
        for rank in (0, 1):
            log = wait_log(p, a, "ready", rank)
            assert "TMPDIR=/tmp\n" in log and "both: 0 1 \n" in log, log
            assert "host: cat: " in log and "No such file" in log  # the host's /tmp is not the job's
            devs |= {ln for ln in log.splitlines() if ln.startswith("dev: ")}
        assert not Path(f"/tmp/x-{tag}").exists() and not Path(f"/dev/shm/y-{tag}-0").exists()  # nor the job's the host's
        assert len(devs) == 1 and devs != {f"dev: {os.stat('/dev/shm').st_dev}"}  # one tmpfs for the node's two ranks
        assert len(tmp_dirs(p, a)) == 1
        bob = p.as_user("bob", "member", "nlp")
        b = p.submit(bob, command=["/bin/sh", "-c", f"cat /tmp/x-{tag} /dev/shm/y-{tag}-0 2>&1; ls /tmp /dev/shm"])["id"]
        assert p.wait(b, ("COMPLETED", "FAILED"))["state"] == "COMPLETED"
        seen = log_of(p, b).splitlines()
        assert f"alices-{tag}" not in seen and f"cat: /tmp/x-{tag}: No such file or directory" in seen
        assert f"cat: /dev/shm/y-{tag}-0: No such file or directory" in seen
        assert not [ln for ln in seen if ln.startswith(("x-", "y-"))]  # bob's listings show none of them
        p.admin.post(f"/api/v1/jobs/{a}/cancel")
        p.wait(a, "CANCELLED")
        wait_gone(p, a)  # released: unmounted, and its directory under the data dir removed
        assert not any(n.startswith(f"j{a}.a") for n in os.listdir(p.cp.data_dir / "tmp"))
    finally:
        host_file.unlink()


def test_what_an_oom_killed_job_left_in_dev_shm_is_freed_when_its_attempt_ends(plane, acc):
    # The red team's case: 200 MB in /dev/shm, then over --mem: OOM-killed. On the host's /dev/shm
    # the 200 MB stayed in RAM, charged to nobody; here they are the job's and go with it.
    p = plane
    alice = p.as_user("alice", "member", "vision")
    before = shmem_mb()
    j = p.submit(alice, mem="256M", command=["/bin/sh", "-c", (
        "dd if=/dev/zero of=/dev/shm/big bs=1M count=200 2>/dev/null; echo written; sleep 2; "
        "head -c 600M /dev/zero | tail > /dev/null")])["id"]
    wait_log(p, j, "written")
    during = shmem_mb()
    end = p.wait(j, ("OUT_OF_MEMORY", "FAILED", "COMPLETED"), timeout=60)
    wait_gone(p, j)
    after = shmem_mb()
    print(f"Shmem: {before:.0f} MB before, {during:.0f} MB with the job's 200 MB /dev/shm file, {after:.0f} MB "
          "once its attempt ended")
    assert end["state"] == "OUT_OF_MEMORY", end["reason"]
    assert during - before > 150  # the file was in RAM while the job ran
    assert during - after > 150  # and is not once it ended (other tests may use some meanwhile)
    assert not Path("/dev/shm/big").exists()
