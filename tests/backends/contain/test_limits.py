"""Limits that hold (issue 15 part 4), with real processes and the machine's real cgroups:
--mem is the kernel's (an attempt over it is OOM-killed and says so), a rank opens only its own
GPU device files, --cpus-per-task is CFS bandwidth, and a mode that cannot enforce a limit
refuses the launch instead of running the job unlimited."""

from __future__ import annotations

import errno
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.backends.helpers import NODES, make_spec, wait_done
from trainyard.backends import BackendError, LocalBackend
from trainyard.backends.base import Limits
from trainyard.backends.contain import mounts

found = mounts.find()
needs_v1 = pytest.mark.skipif(os.geteuid() != 0 or not {"freezer", "memory", "devices", "cpu"} <= set(found.v1),
                              reason="needs root and the v1 freezer, memory, devices and cpu hierarchies")

HOG = [sys.executable, "-c", "x = bytearray(400 * 2**20); print('survived', flush=True)"]


@pytest.fixture
def v1(tmp_path: Path):
    be = LocalBackend(tmp_path, NODES, containment="cgroup1")
    yield be
    for a in be.poll():
        be.release(a.job_id, a.attempt)
    be.close()


@needs_v1
def test_a_rank_over_the_nodes_mem_is_killed_by_the_kernel_and_reported_oom(v1, tmp_path):
    v1.launch(replace(make_spec(tmp_path, 1, HOG), limits=Limits(mem_mib=100)))
    rank = wait_done(v1, 1, timeout=60).ranks[0]
    assert (rank.signal, rank.oom_killed) == (9, True)
    assert "survived" not in (tmp_path / "jobs/1/logs/rank-0.log").read_text()


@needs_v1
def test_mem_per_gpu_scales_with_the_gpus_on_the_node_and_a_job_within_it_runs(v1, tmp_path):
    # 2 GPUs x 300 MiB = 600 MiB for the node: the 400 MiB allocation fits.
    v1.launch(replace(make_spec(tmp_path, 2, HOG, ranks=[(0, "node0", (0, 1))]), limits=Limits(mem_per_gpu_mib=300)))
    rank = wait_done(v1, 2, timeout=60).ranks[0]
    assert (rank.exit_code, rank.oom_killed) == (0, False)
    cell = json.loads((tmp_path / "jobs/2/run/attempt-1/attempt.json").read_text())["contain"]["0"]
    node_mem = Path(cell["memory"]).parent / "memory.limit_in_bytes"
    assert int(node_mem.read_text()) == 600 * 2**20


OPEN_OTHERS = r"""
import errno, json, os, sys
mine = os.environ["TRAINYARD_GPU_DEVICES"].split(",")
every = sorted(p for p in os.listdir(sys.argv[1]) if p.startswith("nvidia"))
out = {}
for name in every:
    path = os.path.join(sys.argv[1], name)
    try:
        os.close(os.open(path, os.O_RDWR))
        out[path] = 0
    except OSError as e:
        out[path] = e.errno
json.dump({"mine": mine, "open": out}, open(sys.argv[2], "w"))
"""


@needs_v1
def test_a_rank_opening_another_ranks_gpu_device_gets_eperm(v1, tmp_path):
    dev = tmp_path / "dev"
    ranks = [(0, "node0", (0,)), (1, "node0", (1,)), (2, "node1", (0,))]
    cmd = ["sh", "-c", f'exec {sys.executable} -c "$0" {dev} {tmp_path}/devs-$RANK.json', OPEN_OTHERS]
    v1.launch(make_spec(tmp_path, 3, cmd, ranks=ranks))
    assert [r.exit_code for r in wait_done(v1, 3, timeout=60).ranks] == [0, 0, 0]
    # Emulated GPUs are character devices 195:<minor>, one minor per GPU of the machine.
    assert sorted(os.minor(os.stat(dev / f"nvidia{m}").st_rdev) for m in range(8)) == list(range(8))
    expected_own = {0: "nvidia0", 1: "nvidia1", 2: "nvidia4"}  # node1's GPU 0 is the machine's fifth
    for r in range(3):
        got = json.loads((tmp_path / f"devs-{r}.json").read_text())
        assert got["mine"] == [str(dev / expected_own[r])]
        for path, err in got["open"].items():
            if path in got["mine"]:
                assert err == errno.ENXIO  # past the cgroup; no driver behind an emulated device
            else:
                assert err == errno.EPERM, (r, path)


BUSY = r"""
import os, sys, time
cg = next(l.split(":", 2)[2].strip() for l in open("/proc/self/cgroup") if l.split(":")[1] == "cpu")
quota = open(os.path.join(sys.argv[1], cg.lstrip("/"), "cpu.cfs_quota_us")).read().strip()
print(os.environ["SLURM_CPUS_PER_TASK"], quota, flush=True)
for _ in range(2):  # two busy processes where one CPU is allowed
    if os.fork() == 0:
        end = time.monotonic() + 2
        while time.monotonic() < end:
            pass
        os._exit(0)
t0, c0 = time.monotonic(), os.times()
os.wait(); os.wait()
c1 = os.times()
print((c1.children_user + c1.children_system) / (time.monotonic() - t0), flush=True)
"""


@needs_v1
def test_cpus_per_task_is_cfs_bandwidth_per_rank(v1, tmp_path):
    mount = next(line.split()[4] for line in open("/proc/self/mountinfo") if " - cgroup " in line
                 and "cpu" in line.split()[-1].split(","))
    v1.launch(replace(make_spec(tmp_path, 4, [sys.executable, "-c", BUSY, mount]), limits=Limits(cpus_per_task=1)))
    assert wait_done(v1, 4, timeout=60).ranks[0].exit_code == 0
    log = (tmp_path / "jobs/4/logs/rank-0.log").read_text().splitlines()
    assert log[1].split() == ["1", "100000"]  # one CPU: 100 ms per 100 ms period
    assert float(log[2]) < 1.25  # two spinning processes got at most about one CPU between them


@pytest.mark.parametrize("mode, words", [("subreaper", "containment is subreaper"),
                                          ("cgroup2", "memory controller")])
def test_a_mode_that_cannot_enforce_mem_refuses_the_launch_naming_it(tmp_path, mode, words):
    if mode == "cgroup2" and (os.geteuid() != 0 or found.v2 is None):
        pytest.skip("needs root and a cgroup2 mount")
    be = LocalBackend(tmp_path, NODES, containment=mode)
    if mode == "cgroup2" and "memory" in be._contain.driver.controllers:  # type: ignore[attr-defined]
        pytest.skip("this cgroup2 has the memory controller")
    with pytest.raises(BackendError, match=rf"--mem.*{words}"):
        be.launch(replace(make_spec(tmp_path, 5, ["true"]), limits=Limits(mem_mib=100)))
    assert be.poll() == []
    assert not (tmp_path / "jobs/5/run/attempt-1").exists()
    be.close()


def test_limits_reach_the_environment_as_slurm_names_them(tmp_path):
    be = LocalBackend(tmp_path, NODES, containment="subreaper")
    be.launch(replace(make_spec(tmp_path, 6, ["sh", "-c", "env > $0", str(tmp_path / "env")]), limits=Limits()))
    wait_done(be, 6)
    env = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line)
    assert "SLURM_MEM_PER_NODE" not in env and "SLURM_CPUS_PER_TASK" not in env
    for a in be.poll():
        be.release(a.job_id, a.attempt)
    be.close()
