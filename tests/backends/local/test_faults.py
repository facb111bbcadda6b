"""Node and rank faults in the local backend's emulation, with real processes.

The backend only injects faults and reports facts (lost, stopped, unhealthy, check result); what to
do about them is the control loop's business and is tested there.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from trainyard.backends import BackendError, LocalBackend
from trainyard.backends.rundir.procfs import read_stat

from tests.backends.helpers import NODES, attempt_state, live, make_spec, wait_done, wait_until

PY = sys.executable
# Counts steps into <job_dir>/steps-<RANK> (job_dir is argv[1]), one every 20 ms, forever.
COUNT = [
    PY,
    "-c",
    "import os, sys, time\n"
    "p = os.path.join(sys.argv[1], 'steps-' + os.environ['RANK'])\n"
    "i = 0\n"
    "while True:\n"
    "    i += 1\n"
    "    open(p + '.tmp', 'w').write(str(i)); os.replace(p + '.tmp', p)\n"
    "    time.sleep(0.02)\n",
]



def steps(job_dir: Path, rank: int) -> int:
    try:
        return int((job_dir / f"steps-{rank}").read_text() or 0)
    except FileNotFoundError:
        return 0


def advancing(job_dir: Path, rank: int, by: int = 3, timeout: float = 10.0) -> None:
    start = steps(job_dir, rank)
    wait_until(lambda: steps(job_dir, rank) >= start + by, timeout, f"rank {rank} to advance")


def frozen(job_dir: Path, rank: int, for_s: float = 0.3) -> bool:
    start = steps(job_dir, rank)
    time.sleep(for_s)
    return steps(job_dir, rank) == start


def pids(job_dir: Path, attempt: int, rank: int) -> tuple[int, int]:
    """(runner pid, command pid) of one rank."""
    rec = json.loads((job_dir / "run" / f"attempt-{attempt}" / f"rank-{rank}.json").read_text())
    return rec["pid"], rec["child_pid"]


def proc_state(pid: int) -> str | None:
    st = read_stat(pid)
    return None if st is None else st.state


def node(be: LocalBackend, name: str):
    return next(n for n in be.inventory() if n.name == name)


# -- dead nodes ----------------------------------------------------------------------------------


def test_kill_node_kills_its_ranks_only_and_they_are_lost_until_and_after_revive(backend, tmp_path):
    job = tmp_path / "jobs" / "1"
    backend.launch(make_spec(tmp_path, 1, COUNT + [str(job)], ranks=[(0, "node0", (0,)), (1, "node0", (1,)), (2, "node1", (0,))]))
    for r in range(3):
        advancing(job, r)
    procs = {r: pids(job, 1, r) for r in range(3)}

    backend.kill_node("node0")

    assert not any(live(p) for r in (0, 1) for p in procs[r])
    assert all(live(p) for p in procs[2])
    advancing(job, 2)
    state = attempt_state(backend, 1)
    assert [(r.running, r.exit_code, r.signal, r.lost) for r in state.ranks] == [
        (False, None, None, True), (False, None, None, True), (True, None, None, False)
    ]
    assert not (job / "run" / "attempt-1" / "rank-0.exit").exists()  # no watcher turned it into "signal 9"
    n0 = node(backend, "node0")
    assert (n0.healthy, n0.state) == (False, "dead") and node(backend, "node1").healthy
    assert json.loads((tmp_path / "nodes" / "node0.json").read_text())["state"] == "dead"
    ok, why = backend.check_node("node0")
    assert not ok and "dead" in why
    with pytest.raises(BackendError, match="node0, which is dead"):
        backend.launch(make_spec(tmp_path, 2, ["true"], ranks=[(0, "node1", ()), (1, "node0", ())]))
    assert attempt_state(backend, 2) is None and not (tmp_path / "jobs" / "2" / "run").exists()

    backend.revive_node("node0")

    assert node(backend, "node0") == NODES[0]
    assert backend.check_node("node0") == (True, "node0 is up and runs processes")
    assert [r.lost for r in attempt_state(backend, 1).ranks] == [True, True, False]  # lost stays lost
    backend.launch(make_spec(tmp_path, 2, ["true"], ranks=[(0, "node0", ())]))
    assert wait_done(backend, 2).ranks[0].exit_code == 0


def test_a_rank_that_ended_before_its_node_died_keeps_its_exit(backend, tmp_path):
    backend.launch(make_spec(tmp_path, 1, [PY, "-c", "raise SystemExit(3)"], ranks=[(0, "node0", ())]))
    wait_done(backend, 1)
    backend.kill_node("node0")
    r = attempt_state(backend, 1).ranks[0]
    assert (r.exit_code, r.lost) == (3, False)


def test_killing_a_hung_node_kills_its_stopped_ranks(backend, tmp_path):
    job = tmp_path / "jobs" / "1"
    backend.launch(make_spec(tmp_path, 1, COUNT + [str(job)], ranks=[(0, "node0", ())]))
    advancing(job, 0)
    backend.hang_node("node0")
    backend.kill_node("node0")
    assert not any(live(p) for p in pids(job, 1, 0))
    r = attempt_state(backend, 1).ranks[0]
    assert (r.running, r.lost, r.stopped) == (False, True, False)


def test_unknown_node_is_an_error_and_fails_its_check(backend):
    for inject in (backend.kill_node, backend.hang_node, backend.revive_node):
        with pytest.raises(BackendError, match="unknown node 'node9'"):
            inject("node9")
    assert backend.check_node("node9") == (False, "unknown node 'node9'")
    assert backend.check_node("node1")[0]


# -- hung nodes ----------------------------------------------------------------------------------


def test_hang_node_stops_its_ranks_and_revive_continues_them(backend, tmp_path):
    job = tmp_path / "jobs" / "1"
    backend.launch(make_spec(tmp_path, 1, COUNT + [str(job)], ranks=[(0, "node0", (0,)), (1, "node1", (0,))]))
    advancing(job, 0)
    advancing(job, 1)
    runner, command = pids(job, 1, 0)

    backend.hang_node("node0")

    assert proc_state(runner) == "T" and proc_state(command) == "T"
    assert all(proc_state(p) != "T" for p in pids(job, 1, 1))
    assert frozen(job, 0)
    advancing(job, 1)
    state = attempt_state(backend, 1)
    assert [(r.running, r.stopped, r.lost) for r in state.ranks] == [(True, True, False), (True, False, False)]
    assert not state.done
    n0 = node(backend, "node0")
    assert (n0.healthy, n0.state) == (False, "hung")
    ok, why = backend.check_node("node0")
    assert not ok and "hung" in why
    with pytest.raises(BackendError, match="which is hung"):
        backend.launch(make_spec(tmp_path, 2, ["true"], ranks=[(0, "node0", ())]))

    backend.revive_node("node0")

    advancing(job, 0)
    assert proc_state(command) != "T"
    assert [(r.running, r.stopped) for r in attempt_state(backend, 1).ranks] == [(True, False), (True, False)]
    assert node(backend, "node0").healthy and backend.check_node("node0")[0]


def test_release_ends_a_hung_rank(backend, tmp_path):
    job = tmp_path / "jobs" / "1"
    backend.launch(make_spec(tmp_path, 1, COUNT + [str(job)], ranks=[(0, "node0", ())]))
    advancing(job, 0)
    procs = pids(job, 1, 0)
    backend.hang_node("node0")
    backend.release(1, 1)
    assert not any(live(p) for p in procs)
    backend.revive_node("node0")  # nothing left to continue: fine


# -- another process injects the fault ------------------------------------------------------------


def test_fault_state_is_shared_with_another_backend_on_the_same_data_dir(backend, tmp_path):
    chaos = LocalBackend(tmp_path, NODES)  # like `yard chaos`: made before the job existed
    job = tmp_path / "jobs" / "1"
    backend.launch(make_spec(tmp_path, 1, COUNT + [str(job)], ranks=[(0, "node0", ()), (1, "node1", ())]))
    advancing(job, 0)
    advancing(job, 1)

    chaos.hang_node("node1")
    assert [r.stopped for r in attempt_state(backend, 1).ranks] == [False, True]
    assert node(backend, "node1").state == "hung" and not backend.check_node("node1")[0]
    chaos.revive_node("node1")
    advancing(job, 1)
    assert node(backend, "node1").healthy

    chaos.kill_node("node1")
    assert [(r.running, r.lost) for r in attempt_state(backend, 1).ranks] == [(True, False), (False, True)]
    assert not node(backend, "node1").healthy
    with pytest.raises(BackendError, match="dead"):
        backend.launch(make_spec(tmp_path, 2, ["true"], ranks=[(0, "node1", ())]))
    assert not (job / "run" / "attempt-1" / "rank-1.exit").exists()

    later = LocalBackend(tmp_path, NODES)  # a restarted owner sees the same facts from disk
    assert [(r.running, r.lost) for r in attempt_state(later, 1).ranks] == [(True, False), (False, True)]
    assert node(later, "node1").state == "dead"
    later.revive_node("node1")
    assert node(backend, "node1").healthy and node(chaos, "node1").healthy


# -- single ranks --------------------------------------------------------------------------------


def test_hang_rank_and_kill_rank_affect_that_rank_only(backend, tmp_path):
    chaos = LocalBackend(tmp_path, NODES)
    job = tmp_path / "jobs" / "1"
    backend.launch(make_spec(tmp_path, 1, COUNT + [str(job)], ranks=[(0, "node0", (0,)), (1, "node0", (1,)), (2, "node0", (2,))]))
    for r in range(3):
        advancing(job, r)

    chaos.hang_rank(1, 1, 0)
    assert proc_state(pids(job, 1, 0)[1]) == "T"
    assert frozen(job, 0)
    advancing(job, 1)
    advancing(job, 2)
    assert [(r.running, r.stopped) for r in attempt_state(backend, 1).ranks] == [(True, True), (True, False), (True, False)]

    chaos.kill_rank(1, 1, 1)
    wait_until(lambda: not attempt_state(backend, 1).ranks[1].running, what="rank 1 to die")
    state = attempt_state(backend, 1)
    assert [(r.running, r.signal, r.lost, r.stopped) for r in state.ranks] == [
        (True, None, False, True), (False, signal.SIGKILL, False, False), (True, None, False, False)
    ]
    advancing(job, 2)

    chaos.kill_rank(1, 1, 0, signal.SIGCONT)
    advancing(job, 0)
    assert all(n.healthy for n in backend.inventory())
    with pytest.raises(BackendError, match="no rank 3"):
        chaos.kill_rank(1, 1, 3)
    with pytest.raises(BackendError, match="job 7 attempt 1"):
        chaos.hang_rank(7, 1, 0)
