"""`LocalBackend.check_cell`: a node's `speed` check runs inside a cgroup of the node with the CPU
quota its ranks get, so `slow_node` slows the check as it slows the ranks (real torch on the CPU,
real cgroups). The CPU path times at least a second (speed.CPU_MIN_TIMED_S), many CFS periods of 100 ms:
a measurement shorter than one period would run inside the period's first slice, unslowed. The
quota is a cap: the slowed figure is bounded whatever the load, the unslowed one gets what the
machine leaves (see tests/backends/local/test_slow_node.py)."""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from pathlib import Path

import pytest

from trainyard.backends import BackendError, LocalBackend
from trainyard.backends.local.check_cell import KEY_PREFIX
from trainyard.control.health import OK, run_check
from trainyard.spec.models import CheckSpec, SpeedSpec

pytest.importorskip("torch")

FACTOR = 8.0  # a cap (1/8 CPU) under any fair share the loaded 2-core machine leaves (test_slow_node.py)
# one rank, one thread, timed for at least speed.CPU_MIN_TIMED_S (ten CFS periods)
SPEC = CheckSpec(name="speed", kind="speed", timeout=120,
                 speed=SpeedSpec(device="cpu", cpu_ranks=1, matmul_n=256, iters=10, baselines={"cpu": {"tflops": 1e-9}}))
UNLIMITED = {"-1", "max"}


def measure(backend: LocalBackend, node: str, tmp_path: Path) -> tuple[float, set[str], set[str]]:
    """The check's TFLOP/s on `node`, and what its cell held while it ran: the CPU quotas seen
    (cgroup v1 cfs_quota_us or v2 cpu.max's first field) and the command lines of its members."""
    quotas: set[str] = set()
    members: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for d in cell_dirs(backend, node):
                for name in ("cpu.cfs_quota_us", "cpu.max"):
                    with contextlib.suppress(OSError):
                        quotas.add(Path(d, name).read_text().split()[0])
                with contextlib.suppress(OSError):
                    for pid in Path(d, "cgroup.procs").read_text().split():
                        with contextlib.suppress(OSError):
                            members.add(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        r = run_check(SPEC, node, tmp_path, cell=backend.check_cell)
    finally:
        done.set()
        t.join()
    assert r.status == OK, r.message
    m = re.search(r"matmul ([0-9.e+-]+) TFLOP/s", r.message)
    assert m, r.message
    return float(m.group(1)), quotas, members


def cell_dirs(backend: LocalBackend, node: str) -> list[str]:
    """The check cell's rank-level directories on every hierarchy (`<base>/speed.<node>/<node>/r0`)."""
    base = backend._contain.driver.base
    return [os.path.join(b, KEY_PREFIX + node, node, "r0") for b in (base.values() if isinstance(base, dict) else [base])]


def cells(backend: LocalBackend) -> list[str]:
    base = backend._contain.driver.base
    dirs = base.values() if isinstance(base, dict) else [base]
    return [n for d in dirs if os.path.isdir(d) for n in os.listdir(d) if n.startswith(KEY_PREFIX)]


def test_the_speed_check_of_a_slowed_node_runs_under_its_quota_measures_it_slow_and_its_cell_goes(backend, tmp_path):
    if backend.containment == "subreaper":
        pytest.skip("no writable cgroup hierarchy here: the check runs where the plane does")
    fast, quotas, members = measure(backend, "node0", tmp_path)
    assert quotas <= UNLIMITED and any("trainyard.control.health.speed" in m for m in members), (quotas, members)
    backend.slow_node("node0", FACTOR)
    slow, quotas, members = measure(backend, "node0", tmp_path)
    assert quotas == {str(int(100_000 / FACTOR))}, quotas  # a rank's quota there: one CPU over the factor
    assert any("trainyard.control.health.speed" in m for m in members), members
    other, quotas, _ = measure(backend, "node1", tmp_path)
    assert quotas <= UNLIMITED, quotas  # the other node is not slowed
    print(f"speed check: node0 {fast:.3g} TFLOP/s, slowed x{FACTOR:g} {slow:.3g}, node1 meanwhile {other:.3g}")
    # the cap holds whatever the load; the unslowed figures get what the load leaves them
    assert slow <= 0.75 * max(fast, other), (fast, slow, other)
    assert cells(backend) == []  # made for each check, removed after it
    backend.revive_node("node0")
    _, quotas, _ = measure(backend, "node0", tmp_path)
    assert quotas <= UNLIMITED, quotas


def test_an_unknown_node_is_refused(backend):
    with pytest.raises(BackendError, match="unknown node"):
        backend.check_cell("node9")
