"""No process of an attempt escapes, whatever sessions it makes: in every containment mode a
`setsid sleep 3600 &` and a double-forked daemon get the attempt's signals and die with it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.backends.contain.conftest import ESCAPER
from tests.backends.helpers import attempt_state, live, make_spec, marked_processes, wait_done, wait_until
from trainyard.backends import LocalBackend
from tests.backends.helpers import NODES


def _escapees(out: Path) -> list[int]:
    wait_until((out / "ready").exists, 30, "the escaper to be ready")
    return [int(p) for p in (out / "pids").read_text().split()]


def _out(tmp_path: Path, name: str = "out") -> Path:
    out = tmp_path / name
    out.mkdir()
    return out


def test_the_notice_reaches_escaped_processes_and_release_leaves_nothing(contained, tmp_path):
    out = _out(tmp_path)
    contained.launch(make_spec(tmp_path, 1, ESCAPER + [str(out), "wait"]))
    pids = _escapees(out)
    daemon = pids[1]
    assert os.getsid(daemon) != os.getsid(contained._attempts[(1, 1)].procs[0].pid)  # it did escape the session
    contained.signal(1, 1, signal.SIGUSR1)
    wait_until((out / f"usr1-{daemon}").exists, 20, "the daemon to get the notice")
    contained.signal(1, 1, signal.SIGTERM)  # the command dies of it; the daemon ignores it
    state = wait_done(contained, 1, timeout=30)
    assert state.ranks[0].signal == signal.SIGTERM
    assert not any(live(p) for p in pids)
    contained.release(1, 1)
    assert marked_processes(tmp_path) == []


def test_a_rank_that_exits_takes_what_it_left_behind_with_it(contained, tmp_path):
    # Like a Slurm step: the rank is over when nothing of it runs. The command exits 0 at once,
    # leaving two escaped processes; the rank is reported done only once they are gone.
    out = _out(tmp_path)
    contained.launch(make_spec(tmp_path, 2, ESCAPER + [str(out), "0"]))
    pids = _escapees(out)
    state = wait_done(contained, 2, timeout=30)
    assert state.ranks[0].exit_code == 0
    assert not any(live(p) for p in pids)
    assert marked_processes(tmp_path) == []


def test_cancel_of_a_gang_ends_every_process_of_every_rank(contained, tmp_path):
    outs = [_out(tmp_path, f"out{r}") for r in range(2)]
    cmd = ["sh", "-c", f'exec {" ".join(ESCAPER)} {tmp_path}/out$RANK wait']
    contained.launch(make_spec(tmp_path, 3, cmd, ranks=[(0, "node0", (0,)), (1, "node1", (0,))]))
    pids = [p for out in outs for p in _escapees(out)]
    contained.release(3, 1)  # what a cancel ends with
    assert not any(live(p) for p in pids)
    assert marked_processes(tmp_path) == []
    assert attempt_state(contained, 3) is None


def test_a_restarted_backend_still_contains_what_an_earlier_one_started(tmp_path, mode):
    # The plane dies (the backend is dropped without release); a new one re-attaches from the
    # run state on disk, cell paths included, and its release still ends the escaped daemons.
    out = _out(tmp_path)
    first = LocalBackend(tmp_path, NODES, containment=mode)
    first.launch(make_spec(tmp_path, 4, ESCAPER + [str(out), "wait"]))
    pids = _escapees(out)
    first.close()
    second = LocalBackend(tmp_path, NODES, containment=mode)
    assert attempt_state(second, 4).ranks[0].running
    second.release(4, 1)
    assert not any(live(p) for p in pids)
    wait_until(lambda: not marked_processes(tmp_path), 30, "nothing left running")
    second.close()


def test_a_hung_rank_killed_by_the_plane_is_reported_killed(contained, tmp_path):
    # hang_rank stops the rank and its runner; the plane's SIGKILL must still end with the rank
    # recorded as killed (the runner is continued to reap it), not running forever.
    contained.launch(make_spec(tmp_path, 5, ["sleep", "3600"]))
    contained.hang_rank(5, 1, 0)
    assert attempt_state(contained, 5).ranks[0].stopped
    contained.signal(5, 1, signal.SIGTERM)  # pending while it is stopped, as on a real node
    contained.signal(5, 1, signal.SIGKILL)
    state = wait_done(contained, 5, timeout=30)
    assert state.ranks[0].signal == signal.SIGKILL


def test_closing_removes_the_cells_of_ended_attempts_and_keeps_running_ones(tmp_path, mode):
    be = LocalBackend(tmp_path, NODES, containment=mode)
    be.launch(make_spec(tmp_path, 7, ["true"]))
    be.launch(make_spec(tmp_path, 8, ["sleep", "3600"]))
    wait_done(be, 7)
    cells = {j: json.loads((tmp_path / f"jobs/{j}/run/attempt-1/attempt.json").read_text())["cell"] for j in (7, 8)}
    be.close()  # the plane stops before releasing job 7
    assert not any(os.path.exists(d) for d in cells[7]["dirs"])
    assert all(os.path.exists(d) for d in cells[8]["dirs"])
    again = LocalBackend(tmp_path, NODES, containment=mode)
    assert attempt_state(again, 8).ranks[0].running
    for j in (7, 8):
        again.release(j, 1)
    assert not any(os.path.exists(d) for c in cells.values() for d in c["dirs"])
    assert marked_processes(tmp_path) == []
    again.close()
