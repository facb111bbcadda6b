"""`LocalBackend.cpu_seconds` (issue 38, idle allocations): the CPU time of an attempt's real
processes, read from its cell (the cgroup's own counter; /proc in the subreaper mode), so that a
busy rank tells from an idle one, whatever session its processes started and after they exit.

Each containment this machine has: `auto` (its best cgroups), `cgroup2` where the unified hierarchy
is writable (tracking only on a hybrid machine: cpu.stat is there without the cpu controller), and
`subreaper`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.accounts import ROOT_ONLY, shared_dir
from tests.backends.helpers import local_backend, make_spec
from trainyard.backends import LocalBackend

pytestmark = ROOT_ONLY

BUSY = "while :; do :; done"
# busy in a session of its own (setsid): not in the rank's process group, still in its cell
ESCAPED = ["sh", "-c", f"setsid sh -c '{BUSY}' </dev/null >/dev/null 2>&1 & exec sleep 300"]
IDLE = ["sleep", "300"]
# busy for a second, then gone (reaped by the rank's shell, which then sleeps)
WAS_BUSY = ["sh", "-c", f"timeout 1 sh -c '{BUSY}'; exec sleep 300"]


@pytest.fixture(params=["auto", "cgroup2", "subreaper"])
def backend(request: pytest.FixtureRequest) -> Iterator[LocalBackend]:
    with shared_dir("tycpu-") as place, local_backend(place / "data", request.param) as be:
        yield be


def _data(be: LocalBackend) -> Path:
    return be._data_dir


def launch(be: LocalBackend, job: int, command: list[str], ranks=((0, "node0", (0,)),)) -> None:
    be.launch(make_spec(_data(be), job, command, ranks=ranks))


def used(be: LocalBackend, job: int, over_s: float) -> float:
    """CPU seconds the attempt used during the next `over_s` seconds."""
    before = be.cpu_seconds(job, 1)
    assert before is not None and before >= 0
    time.sleep(over_s)
    after = be.cpu_seconds(job, 1)
    assert after is not None
    return after - before


def test_a_busy_rank_counts_and_an_idle_one_does_not(backend):
    launch(backend, 1, ESCAPED, ranks=((0, "node0", (0,)), (1, "node1", (0,))))  # two nodes: both count
    launch(backend, 2, IDLE)
    time.sleep(0.3)
    busy, idle = used(backend, 1, 1.5), used(backend, 2, 1.5)
    # two busy loops on a machine shared with others: well above the idle threshold, not 2 x 1.5 s
    assert busy >= 0.4, f"two busy ranks used only {busy:.2f} CPU s in 1.5 s"
    assert idle < 0.1, f"a sleeping rank used {idle:.2f} CPU s in 1.5 s"


def test_what_exited_still_counts(backend):
    launch(backend, 3, WAS_BUSY)
    time.sleep(1.5)  # the busy second is over; what remains sleeps
    total = backend.cpu_seconds(3, 1)
    assert total is not None and total >= 0.3, f"the exited busy second left {total} CPU s"
    assert used(backend, 3, 1.0) < 0.1


def test_an_attempt_it_does_not_run_is_unknown(backend):
    assert backend.cpu_seconds(99, 1) is None
    launch(backend, 4, IDLE)
    assert backend.cpu_seconds(4, 2) is None
    assert backend.gpu_percent(4, 1) is None  # emulated GPUs: NVML cannot read them


def test_a_terminal_in_the_rank_counts_where_it_joins_the_cell(backend):
    """`yard shell` / `yard alloc`'s shell runs in the rank's cgroups: a build started there keeps an
    allocation busy. In the subreaper mode there is no cgroup to join: its input counts instead."""
    if backend.containment == "subreaper":
        pytest.skip("subreaper: a terminal is no descendant of the rank runner")
    launch(backend, 5, IDLE)
    time.sleep(0.3)
    assert used(backend, 5, 0.5) < 0.1
    t = backend.open_terminal(5, 1, 0, ["sh", "-c", BUSY])
    try:
        time.sleep(0.3)
        assert used(backend, 5, 1.0) >= 0.3
    finally:
        os.kill(t.pid, 9)  # the rest of the terminal is in the cell: the release ends it
        os.waitpid(t.pid, 0)
        os.close(t.fd)
