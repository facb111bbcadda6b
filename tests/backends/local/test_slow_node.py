"""`LocalBackend.slow_node`: a node's ranks slowed by a factor through their cells' CPU quota.

Real CPU-bound ranks; the work measured is the CPU time a rank's process consumes over a wall
window (/proc/<pid>/stat), not the wall time of a task, so the figures hold on a loaded 2-core
machine: the quota caps the slowed rank at 1/F of a CPU whatever the load (asserted always), while
the unslowed rank gets what the machine has left. The ratio slowed/unslowed is 1/F only when the
unslowed rank gets a whole core; under load it gets its fair share, so then the test asserts the
ratio is clearly below 1 (and near 1/F when the unslowed rank did have a core).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from trainyard.backends import BackendError, LocalBackend
from trainyard.backends.contain import cpu_quota

from tests.backends.helpers import NODES, make_spec, wait_until

FACTOR = 8.0  # a cap (1/8 CPU) well under any fair share a loaded 2-core machine leaves a rank
WINDOW_S = 3.0
BUSY = [sys.executable, "-c", "while True:\n    pass\n"]  # one CPU-bound thread: a rank's training loop
TICK = os.sysconf("SC_CLK_TCK")


def child_pid(job_dir: Path, attempt: int, rank: int) -> int:
    def pid() -> int | None:
        try:
            return json.loads((job_dir / "run" / f"attempt-{attempt}" / f"rank-{rank}.json").read_text()).get("child_pid")
        except (OSError, ValueError):
            return None
    return int(wait_until(pid, 10, f"rank {rank} of {job_dir.name} to start"))  # type: ignore[arg-type]


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def check_slowed(slow: float, fast: float) -> None:
    assert slow <= 1.25 / FACTOR, f"the slowed rank used {slow:.3f} CPU, over its quota of {1 / FACTOR:.3f}"
    assert slow >= 0.3 / FACTOR, f"the slowed rank barely ran ({slow:.3f} CPU): slowed, not stopped"
    assert slow / fast <= 0.75, f"slowed {slow:.3f} vs unslowed {fast:.3f} CPU: not measurably slower"
    if fast >= 0.8:  # the unslowed rank had a core: the ratio is the factor's
        assert 0.5 / FACTOR <= slow / fast <= 1.5 / FACTOR, (slow, fast)


def quota(job_dir: Path, attempt: int, rank: int) -> str:
    """The rank's CPU quota as its cgroup says it: v1 cfs_quota_us, v2 cpu.max's first field."""
    plan = json.loads((job_dir / "run" / f"attempt-{attempt}" / "attempt.json").read_text())["contain"][str(rank)]
    if plan["mode"] == "cgroup1":
        d = next(j for j in plan["join"] if os.path.exists(os.path.join(j, "cpu.cfs_quota_us")))
        return Path(d, "cpu.cfs_quota_us").read_text().strip()
    return Path(plan["freezer"], "cpu.max").read_text().split()[0]


SLOWED = str(int(100_000 / FACTOR))
UNLIMITED = ("-1", "max")


def rates(pids: list[int], window_s: float = WINDOW_S) -> list[float]:
    """CPUs each process used on average over the window (1.0 = one core all the time)."""
    t0, c0 = time.monotonic(), [cpu_s(p) for p in pids]
    time.sleep(window_s)
    t1, c1 = time.monotonic(), [cpu_s(p) for p in pids]
    return [(b - a) / (t1 - t0) for a, b in zip(c0, c1)]


@pytest.fixture
def cgroup_backend(backend):
    if backend.containment == "subreaper":
        pytest.skip("no writable cgroup hierarchy here: the quota cannot be set (the subreaper test covers the refusal)")
    return backend


def test_a_running_rank_on_the_slowed_node_does_about_1_over_f_of_the_work_until_revive(cgroup_backend, tmp_path):
    be = cgroup_backend
    job = tmp_path / "jobs" / "1"
    be.launch(make_spec(tmp_path, 1, BUSY, ranks=[(0, "node0", (0,)), (1, "node1", (0,))]))
    pids = [child_pid(job, 1, 0), child_pid(job, 1, 1)]
    rates(pids, 0.5)  # settle

    be.slow_node("node0", FACTOR)
    slow, fast = rates(pids)
    print(f"slowed x{FACTOR:g}: node0 rank {slow:.3f} CPU, node1 rank {fast:.3f} CPU, ratio {slow / fast:.3f}")
    check_slowed(slow, fast)
    assert quota(job, 1, 0) == SLOWED and quota(job, 1, 1) in UNLIMITED
    assert be.poll()[0].ranks[0].running and not be.poll()[0].ranks[0].stopped
    assert next(n for n in be.inventory() if n.name == "node0").healthy  # slow is not down

    be.revive_node("node0")
    revived, other = rates(pids)
    print(f"revived: node0 rank {revived:.3f} CPU, node1 rank {other:.3f} CPU")
    # as fast as its peer on the other node (both get what the load leaves), no longer capped
    assert revived >= 0.8 * other, f"revived rank still slow: {revived:.3f} CPU vs {other:.3f}"
    assert quota(job, 1, 0) in UNLIMITED and quota(job, 1, 1) in UNLIMITED  # its own again: no limit


def test_ranks_launched_later_are_slowed_also_by_a_restarted_plane_and_not_after_revive(cgroup_backend, tmp_path):
    be = cgroup_backend
    be.slow_node("node0", FACTOR)
    state = json.loads((tmp_path / "nodes" / "node0.json").read_text())
    assert state["state"] == "up" and state["slow"] == FACTOR

    be.launch(make_spec(tmp_path, 2, BUSY, ranks=[(0, "node0", (0,)), (1, "node1", (0,))]))
    pids = [child_pid(tmp_path / "jobs" / "2", 1, r) for r in (0, 1)]
    # a fresh backend on the same data dir (a restarted plane) launches on the slowed node
    be2 = LocalBackend(tmp_path, NODES)
    try:
        be2.launch(make_spec(tmp_path, 3, BUSY, ranks=[(0, "node0", (1,))]))
        pids.append(child_pid(tmp_path / "jobs" / "3", 1, 0))
        later, fast, restarted = rates(pids)
        print(f"launched after slow x{FACTOR:g}: {later:.3f} CPU (restarted plane: {restarted:.3f}), "
              f"node1 {fast:.3f} CPU")
        check_slowed(later, fast)
        check_slowed(restarted, fast)
        assert quota(tmp_path / "jobs" / "3", 1, 0) == SLOWED

        be2.release(3, 1)  # fewer busy processes, so the revived ones get a fair share each
        be2.revive_node("node0")
        assert "slow" not in json.loads((tmp_path / "nodes" / "node0.json").read_text())
        be.launch(make_spec(tmp_path, 4, BUSY, ranks=[(0, "node0", (2,))]))
        watched = [child_pid(tmp_path / "jobs" / "4", 1, 0), pids[0], pids[1]]
        for _ in range(3):  # three busy ranks share two cores with the rest of the suite: a window may be unfair
            new, earlier, other = rates(watched)
            print(f"after revive: new rank {new:.3f} CPU, earlier rank {earlier:.3f} CPU, node1 {other:.3f} CPU")
            if new >= 0.8 * other and earlier >= 0.8 * other:
                break
        assert new >= 0.8 * other and earlier >= 0.8 * other, (new, earlier, other)
        assert quota(tmp_path / "jobs" / "4", 1, 0) in UNLIMITED and quota(tmp_path / "jobs" / "2", 1, 0) in UNLIMITED
    finally:
        if any(a.job_id == 3 for a in be2.poll()):
            be2.release(3, 1)
        be2.close()


def test_a_bad_factor_or_node_is_refused_and_nothing_recorded(backend, tmp_path):
    for bad in (1.0, 0.5, -2.0, 101.0, float("nan")):
        with pytest.raises(BackendError, match="factor"):
            backend.slow_node("node0", bad)
    with pytest.raises(BackendError, match="unknown node"):
        backend.slow_node("node9", 2.0)
    assert not (tmp_path / "nodes" / "node0.json").exists()


@pytest.mark.parametrize("mode", ["subreaper", "cgroup2"])
def test_a_containment_without_a_cpu_quota_says_it_cannot(tmp_path, mode):
    try:
        be = LocalBackend(tmp_path, NODES, containment=mode)
    except BackendError as e:
        pytest.skip(f"{mode} not usable here: {e}")
    if mode == "cgroup2" and "cpu" in be._contain.driver.controllers:
        be.close()
        pytest.skip("cgroup2 has the cpu controller here: it can slow ranks")
    try:
        with pytest.raises(BackendError, match="cannot slow its ranks.*(no CPU quota|cpu controller)"):
            be.slow_node("node0", 2.0)
        assert not (tmp_path / "nodes" / "node0.json").exists()
        be.revive_node("node0")  # nothing was slowed: reviving is fine
    finally:
        be.close()


def test_quota_arithmetic():
    assert cpu_quota.quota_us(None, 2.0) == 50_000  # one CPU over 2
    assert cpu_quota.quota_us(3, 2.0) == 150_000  # --cpus-per-task 3 over 2
    assert cpu_quota.quota_us(None, 100.0) == 1_000
    assert cpu_quota.quota_us(None, None) is None and cpu_quota.quota_us(2, None) == 200_000
