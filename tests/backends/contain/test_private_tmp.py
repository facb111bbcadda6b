"""Private /tmp and /dev/shm per attempt and node (issue 34 point 3), with real mounts and real
rank processes: the tmpfs is sized by --mem and shared by the ranks of one node only, TMPDIR is
set, the job's own paths under the host's /tmp stay reachable, release and a restarted plane's
sweep unmount it, and the `dir` mode (where namespaces are not allowed) gives each attempt a
TMPDIR of its own that goes at release. The attacks (another account's job, the host, the
memory an OOM-killed job left) are tests/security/test_private_tmp.py."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from tests.backends.helpers import NODES, make_spec, wait_done
from trainyard.backends import BackendError, LocalBackend
from trainyard.backends.base import Limits
from trainyard.backends.contain import ContainmentError, private_tmp

ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def mounts_under(d: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(str(d) + "/")]


@pytest.fixture
def backend(tmp_path: Path):
    be = LocalBackend(tmp_path, NODES, private_tmp_mode="tmpfs")
    yield be
    for a in be.poll():
        be.release(a.job_id, a.attempt)
    be.close()


def test_the_names_under_tmp_to_keep_and_node_names_as_path_components():
    assert private_tmp.exposed(["/tmp/a/b", "/tmp/a/c", "/tmp//d/../e/f", "/home/x", "/tmp", "/tmpx/y"]) == ["a", "e"]
    assert private_tmp.safe_name("node-0.a_b") == "node-0.a_b"
    assert private_tmp.safe_name("../etc") == "n" + b"../etc".hex()
    assert "/" not in private_tmp.safe_name("a/b")


def test_an_unknown_mode_is_an_error_naming_the_choices(tmp_path):
    with pytest.raises(ContainmentError, match="unknown mode 'ram'.*auto, tmpfs, dir"):
        private_tmp.choose("ram", str(tmp_path))
    with pytest.raises(BackendError, match="unknown mode"):
        LocalBackend(tmp_path, NODES, private_tmp_mode="ram")


@ROOT
def test_ranks_of_one_node_share_a_tmpfs_sized_by_mem_with_tmpdir_set_and_other_nodes_do_not(backend, tmp_path):
    # Each rank writes /dev/shm/r<rank> and /tmp/t<rank>, then lists what it sees once all three wrote.
    cmd = ["sh", "-c", 'echo "TMPDIR=$TMPDIR"; echo x > /dev/shm/r$RANK; echo x > /tmp/t$RANK; '
                       f'touch {tmp_path}/done$RANK; while [ ! -e {tmp_path}/done0 ] || [ ! -e {tmp_path}/done1 ] '
                       f'|| [ ! -e {tmp_path}/done2 ]; do sleep 0.05; done; '
                       'echo "shm: $(ls /dev/shm | tr "\\n" " ")"; echo "tmp: $(ls /tmp | tr "\\n" " ")"; '
                       "df -k /dev/shm | tail -1"]
    ranks = [(0, "node0", (0,)), (1, "node0", (1,)), (2, "node1", (0,))]
    backend.launch(replace(make_spec(tmp_path, 1, cmd, ranks=ranks), limits=Limits(mem_mib=64)))
    assert [r.exit_code for r in wait_done(backend, 1, timeout=30).ranks] == [0, 0, 0]
    logs = [(tmp_path / f"jobs/1/logs/rank-{r}.log").read_text() for r in range(3)]
    for log in logs:
        assert "TMPDIR=/tmp\n" in log
        assert f"tmp: {tmp_path.parts[2]} " in log  # the test's own dir under /tmp stays reachable
    assert "shm: r0 r1 \n" in logs[0] and "shm: r0 r1 \n" in logs[1]  # node0's ranks share it
    assert "shm: r2 \n" in logs[2] and "t2" in logs[2] and "t0" not in logs[2]  # node1 has its own
    assert int(logs[0].strip().splitlines()[-1].split()[1]) == 64 * 1024  # the tmpfs is --mem's size
    assert not any(Path(p).exists() for p in ("/dev/shm/r0", "/tmp/t0"))  # not the host's


def tmp_of(pid: int) -> str:
    """The file system type a process sees on /tmp (its own mount namespace's)."""
    with open(f"/proc/{pid}/mountinfo") as f:
        return next(ln.split(" - ")[1].split()[0] for ln in f if ln.split()[4] == "/tmp")


@ROOT
def test_once_the_ranks_hold_it_the_plane_lets_go_and_release_or_a_restart_removes_what_is_left(backend, tmp_path):
    backend.launch(make_spec(tmp_path, 2, ["sleep", "30"]))
    # The rank's /tmp is the tmpfs; the plane's own mount of it is detached (the kernel frees it with
    # the attempt's last process), its directory stays until release.
    child = json.loads((tmp_path / "jobs/2/run/attempt-1/rank-0.json").read_text())["child_pid"]
    assert tmp_of(child) == "tmpfs" and os.stat(f"/proc/{child}/root/tmp").st_dev != os.stat("/tmp").st_dev
    assert mounts_under(tmp_path / "tmp") == [] and os.listdir(tmp_path / "tmp") == ["j2.a1.node0"]
    backend.release(2, 1)
    assert os.listdir(tmp_path / "tmp") == []
    # A plane that died after mounting, before its ranks started: the next one sweeps it.
    backend.launch(make_spec(tmp_path, 3, ["sleep", "30"]))
    left = private_tmp.choose("tmpfs", str(tmp_path))
    left.prepare("j9.a1", {"node1": None}, str(tmp_path), None)
    assert mounts_under(tmp_path / "tmp") == [str(tmp_path / "tmp/j9.a1.node1")]
    backend.close()  # the plane stops; job 3 runs on
    again = LocalBackend(tmp_path, NODES, private_tmp_mode="tmpfs")  # re-attaches job 3, sweeps j9.a1
    try:
        assert mounts_under(tmp_path / "tmp") == [] and os.listdir(tmp_path / "tmp") == ["j3.a1.node0"]
    finally:
        again.release(3, 1)
        again.close()
    assert os.listdir(tmp_path / "tmp") == []


def test_the_dir_mode_gives_each_attempt_a_tmpdir_of_its_own_gone_at_release(tmp_path):
    be = LocalBackend(tmp_path, NODES, private_tmp_mode="dir")
    try:
        assert "private /tmp and /dev/shm: NO" in be.containment_line
        be.launch(make_spec(tmp_path, 4, ["sh", "-c", 'echo "TMPDIR=$TMPDIR"; echo x > "$TMPDIR/f"']))
        assert wait_done(be, 4, timeout=30).ranks[0].exit_code == 0
        tmpdir = tmp_path / "jobs/4/run/attempt-1/tmp.node0"
        assert f"TMPDIR={tmpdir}\n" in (tmp_path / "jobs/4/logs/rank-0.log").read_text()
        assert (tmpdir / "f").exists() and tmpdir.stat().st_mode & 0o777 == 0o700
        be.release(4, 1)
        assert not tmpdir.exists()
    finally:
        be.close()


@ROOT
def test_a_stopping_plane_removes_the_tmp_of_ended_attempts_and_keeps_the_running_ones(tmp_path):
    be = LocalBackend(tmp_path, NODES, private_tmp_mode="tmpfs")
    be.launch(make_spec(tmp_path, 7, ["true"]))
    be.launch(make_spec(tmp_path, 8, ["sleep", "30"]))
    wait_done(be, 7, timeout=30)
    be.close()  # job 7 ended unreleased (the plane stopped first), job 8 runs on
    assert os.listdir(tmp_path / "tmp") == ["j8.a1.node0"]
    again = LocalBackend(tmp_path, NODES, private_tmp_mode="tmpfs")
    for a in again.poll():
        again.release(a.job_id, a.attempt)
    again.close()
    assert os.listdir(tmp_path / "tmp") == []
