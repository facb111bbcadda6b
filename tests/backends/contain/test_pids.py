"""The pids limit per job (issue 34 point 4), with real processes and the machine's real cgroups:
pids.max is written on the attempt's node cgroup (its ranks there share it), a rank whose fork the
limit refused is ended by its runner and says so (`pids_max_hit`), a job within its limit is not
touched, a batch script's cell holds the allocation's limit, and a mode without a pids
controller says so and runs the job (the limit is every job's default, not a job's request)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.backends.helpers import NODES, make_spec, wait_done
from trainyard.backends import LocalBackend
from trainyard.backends.base import Limits
from trainyard.backends.contain import cgroup2, mounts

found = mounts.find()


def pids_modes() -> list[str]:
    """The modes that limit pids on this machine: cgroup1 with a pids hierarchy, cgroup2 with the
    pids controller delegated."""
    if os.geteuid() != 0:
        return []
    out = ["cgroup1"] if {"freezer", "pids"} <= set(found.v1) else []
    if found.v2 is not None:
        try:
            if "pids" in cgroup2.Cgroup2(found.v2, "/nonexistent-probe").controllers:
                out.append("cgroup2")
        except Exception:
            pass
    return out


@pytest.fixture(params=pids_modes() or [pytest.param("none", marks=pytest.mark.skip("no pids controller here"))])
def limited(request, tmp_path: Path):
    be = LocalBackend(tmp_path, NODES, containment=request.param)
    yield be
    for a in be.poll():
        be.release(a.job_id, a.attempt)
    be.close()


def plan_of(tmp_path: Path, job: int, rank: int = 0) -> dict:
    return json.loads((tmp_path / f"jobs/{job}/run/attempt-1/attempt.json").read_text())["contain"][str(rank)]


# Forks children that sleep until it has made `n` of them or a fork fails (then it says how many,
# and exits 3): what a thread pool or a DataLoader does when it cannot start a worker.
FORKER = r"""
import os, sys, time
n, made = int(sys.argv[1]), 0
try:
    for _ in range(n):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        made += 1
except OSError as e:
    print(f"fork refused after {made}: {e}", flush=True)
    time.sleep(30)  # the runner ends the rank at the refusal, not this program's exit
    sys.exit(3)
print(f"made {made}", flush=True)
"""


def test_the_limit_is_the_node_cgroups_pids_max_shared_by_its_ranks(limited, tmp_path):
    ranks = [(0, "node0", (0,)), (1, "node0", (1,)), (2, "node1", (0,))]
    limited.launch(replace(make_spec(tmp_path, 1, ["sleep", "30"], ranks=ranks), limits=Limits(pids_max=300)))
    plans = [plan_of(tmp_path, 1, r) for r in range(3)]
    assert plans[0]["pids_node"] == plans[1]["pids_node"] != plans[2]["pids_node"]  # one per node
    for p in plans:
        assert p["pids_max"] == 300
        assert Path(p["pids_node"], "pids.max").read_text().strip() == "300"
        assert all(os.path.exists(e) for e in p["pids_events"])
    limited.release(1, 1)


def test_a_rank_whose_fork_the_limit_refused_is_ended_and_says_so(limited, tmp_path):
    limited.launch(replace(make_spec(tmp_path, 2, [sys.executable, "-c", FORKER, "1000"]),
                           limits=Limits(pids_max=64)))
    rank = wait_done(limited, 2, timeout=30).ranks[0]
    assert (rank.signal, rank.pids_max_hit, rank.pids_max) == (9, True, 64)  # ended by the runner, not exit 3
    exit_rec = json.loads((tmp_path / "jobs/2/run/attempt-1/rank-0.exit").read_text())
    assert 0 < exit_rec["pids_peak"] <= 64
    assert "fork refused after" in (tmp_path / "jobs/2/logs/rank-0.log").read_text()


def test_a_job_within_its_limit_runs_untouched(limited, tmp_path):
    limited.launch(replace(make_spec(tmp_path, 3, [sys.executable, "-c", FORKER.replace("time.sleep(60)", "pass"),
                                                   "100"]), limits=Limits(pids_max=200)))
    rank = wait_done(limited, 3, timeout=30).ranks[0]
    assert (rank.exit_code, rank.pids_max_hit, rank.pids_max) == (0, False, 200)


def test_a_batch_scripts_cell_holds_the_limit_of_every_node_of_its_allocation(limited, tmp_path):
    spec = replace(make_spec(tmp_path, 4, ["sleep", "30"], ranks=[(0, "node0", (0,)), (1, "node1", (0,))]),
                   limits=Limits(pids_max=100), batch=True)
    limited.launch(spec)
    plan = plan_of(tmp_path, 4)
    assert plan["pids_max"] == 200  # its srun tasks on both nodes run in the script's one cell
    assert Path(plan["pids_node"], "pids.max").read_text().strip() == "200"
    limited.release(4, 1)


def test_without_a_pids_controller_the_job_runs_unlimited_and_the_line_says_so(tmp_path):
    be = LocalBackend(tmp_path, NODES, containment="subreaper")
    try:
        assert "pids not limited" in be.containment_line
        be.launch(replace(make_spec(tmp_path, 5, ["true"]), limits=Limits(pids_max=64)))
        rank = wait_done(be, 5, timeout=30).ranks[0]
        assert (rank.exit_code, rank.pids_max_hit, rank.pids_max) == (0, False, None)
        assert "pids_max" not in plan_of(tmp_path, 5)
    finally:
        for a in be.poll():
            be.release(a.job_id, a.attempt)
        be.close()
