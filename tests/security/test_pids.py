"""Attack: a fork bomb (issue 34 point 4). A member's job forks without end to take the host's
pid space (32,768 on the red team's host; a job once started 1,500 processes unchecked). Defence:
every job has a pids limit per node (the cgroup's pids.max: the configuration's, per class and
team), the kernel refuses its forks past it, and the rank runner ends the rank at the first
refusal; the job ends FAILED with a reason naming the limit, and the host forks on.

A root plane in this process, real accounts (tests/accounts.py), the machine's real cgroups. The
bomb runs under `ulimit -u` as a safety net for the machine running the suite (RLIMIT_NPROC
counts the account's processes, and this account has no others): were the cgroup's limit
missing, the bomb would stop there and the test still fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.accounts import ROOT_ONLY, Accounts
from tests.plane import Plane, job_dir
from tests.security.hostile import config_text, root_plane, two_accounts
from trainyard.backends.contain import cgroup2, mounts

found = mounts.find()


def _pids_controller() -> bool:
    if "pids" in found.v1 and "freezer" in found.v1:
        return True
    try:
        return found.v2 is not None and "pids" in cgroup2.Cgroup2(found.v2, "/nonexistent-probe").controllers
    except Exception:
        return False


pytestmark = [ROOT_ONLY, pytest.mark.skipif(os.geteuid() == 0 and not _pids_controller(),
                                            reason="no pids controller (cgroup v1 pids or v2 pids) here")]

LIMIT = 256
# The classic bomb, each call forking two more in the background, behind a safety net of 1,000.
BOMB = "ulimit -u 1000; b() { b | b & }; b; sleep 600"


@pytest.fixture(scope="module")
def acc() -> Iterator[Accounts]:
    with two_accounts() as a:
        yield a


@pytest.fixture(scope="module")
def plane(acc: Accounts) -> Iterator[Plane]:
    with root_plane(acc, "ty-pids-", config_text(acc, vision=f"    pids_max: {LIMIT}\n")) as p:
        yield p


def node_cgroup(p: Plane, job: int, timeout: float = 60) -> Path:
    """The pids cgroup of the job's node, from its attempt.json, as soon as it is written."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            plan = json.loads((job_dir(p.cp.data_dir, job) / "run/attempt-1/attempt.json").read_text())["contain"]["0"]
            return Path(plan["pids_node"])
        except (OSError, ValueError, AssertionError):
            assert time.monotonic() < deadline, "the attempt was not launched"
            time.sleep(0.01)


def test_a_fork_bomb_ends_failed_naming_the_limit_and_the_host_forks_on(plane, acc):
    p = plane
    alice = p.as_user("alice", "member", "vision")
    j = p.submit(alice, command=["/bin/bash", "-c", BOMB])["id"]
    node = node_cgroup(p, j)
    most, peak = 0, 0  # pids.current sampled while it runs; pids.peak: the kernel's own high-water mark
    deadline = time.monotonic() + 60
    while p.job(j)["state"] in ("PENDING", "RUNNING", "COMPLETING"):
        assert time.monotonic() < deadline, f"the bomb still runs ({most} processes)"
        for name in ("pids.current", "pids.peak"):
            try:
                value = int((node / name).read_text())
            except (OSError, ValueError):
                continue
            most, peak = (max(most, value), peak) if name == "pids.current" else (most, max(peak, value))
        time.sleep(0.002)
    end = p.wait(j, "FAILED", timeout=60)
    print(f"fork bomb with pids_max {LIMIT}: pids.current sampled up to {most}, pids.peak {peak}; "
          f"FAILED {end['end_time'] - end['start_time']:.2f} s after its start")
    assert end["reason"] == f"pids limit: rank 0 hit the job's limit of {LIMIT} processes (pids_max)"
    assert end["pids_max"] == LIMIT  # `yard show`'s PidsLimit=
    assert 0 < most <= LIMIT and peak <= LIMIT
    attempt = end["attempts"][-1] if end.get("attempts") else None
    assert attempt is None or attempt["cause"] == "pids"
    # Nothing of the bomb runs (zombies wait for init to reap them: they hold a pid, no task), and
    # the host, the bomb's own account included, can fork.
    ps = subprocess.run(["ps", "-u", acc.user("alice"), "-o", "stat="], capture_output=True, text=True).stdout
    assert [s for s in ps.split() if not s.startswith("Z")] == []
    assert subprocess.run(["runuser", "-u", acc.user("alice"), "--", "/bin/sh", "-c", "true & wait"]).returncode == 0


def test_a_job_within_the_limit_of_another_team_is_untouched_and_gets_the_default(plane, acc):
    p = plane
    bob = p.as_user("bob", "member", "nlp")
    # 300 sleepers: over vision's 256, within the built-in 4096 nlp's jobs get
    j = p.submit(bob, command=["/bin/sh", "-c", "for i in $(seq 300); do sleep 2 & done; wait"])["id"]
    end = p.wait(j, ("COMPLETED", "FAILED"), timeout=60)
    assert (end["state"], end["pids_max"]) == ("COMPLETED", 4096), end["reason"]
