"""`SlurmBackend.open_terminal` on the real 2-node test cluster (tests/slurm_cluster.py): Slurm's own
`srun --jobid --overlap --pty` into a running attempt, on the rank's node, read and written
through `Terminal.fd` (skipped with the reason where Slurm cannot be installed or we are not root)."""

from __future__ import annotations

import json
import os
import pwd
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.accounts import accounts, shared_dir
from tests.backends.helpers import make_spec, marked_processes, wait_until
from tests.backends.terminal_io import Screen
from tests.slurm_cluster import SlurmCluster, slurm_available
from trainyard.backends.base import BackendError, Owner
from trainyard.backends.rundir import job_tools
from trainyard.contracts import JobDir
from trainyard.control.jobfiles import ownership
from trainyard.services.owners import Identity
from trainyard.backends.slurm.backend import SlurmBackend

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm-terminal")]


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    """In a directory every account passes through: an owner's `srun` reads its slurm.conf and
    munge socket."""
    reason = slurm_available()
    if reason:
        pytest.skip(reason)
    with shared_dir("ty-slurm-term-cluster-") as d:
        c = SlurmCluster(d / "slurm")
        c.start()
        try:
            yield c
        finally:
            c.stop()


def test_a_terminal_in_rank_1_runs_on_its_node_in_the_job_and_passes_ctrl_c_and_the_exit(cluster, tmp_path: Path):
    be = SlurmBackend(tmp_path, env=cluster.env(), launch_timeout_s=120)
    be.launch(make_spec(tmp_path, 1, ["sleep", "300"], ranks=[(0, "n1", (0,)), (1, "n2", (0,))]))
    slurm_id = json.loads((tmp_path / "jobs" / "1" / "run" / "attempt-1" / "attempt.json").read_text())["slurm_job_id"]
    try:
        screen = Screen(be.open_terminal(1, 1, 1, ["sh", "-c", 'echo "on=$SLURMD_NODENAME job=$SLURM_JOB_ID"; '
                                                   'tty; exit 5'], term="vt100"))
        try:
            status = screen.finish(timeout=60)
        finally:
            screen.close()
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 5, screen.seen
        assert f"on=n2 job={slurm_id}" in screen.seen and "/dev/pts/" in screen.seen, screen.seen
        screen = Screen(be.open_terminal(1, 1, 0, ["sh", "-i"]))
        try:
            screen.expect(r"[$#] ", timeout=60)
            screen.send("sleep 100\n")
            screen.expect(r"sleep 100\n", timeout=20)  # echoed by the node's pty
            time.sleep(1.0)  # srun forwards the keys to the node's pty: no local child to wait for
            screen.send("\x03")
            screen.expect(r"\^C[\s\S]*?[$#] ", timeout=20)
            screen.send("echo status-$?\n")
            screen.expect(r"status-130", timeout=20)
            screen.send("exit 3\n")
            status = screen.finish(timeout=60)
        finally:
            screen.close()
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3, screen.seen
        with pytest.raises(BackendError, match="job 1 attempt 1 rank 2: no such running rank"):
            be.open_terminal(1, 1, 2, [])
    finally:
        be.release(1, 1)
        wait_until(lambda: marked_processes(tmp_path) == [], timeout=60, what="the ranks gone")


@pytest.mark.skipif(os.geteuid() != 0, reason="running a job as another user needs root")
def test_a_terminal_in_an_owners_job_runs_as_the_owner(cluster):
    if job_tools.default_python() == sys.executable:
        pytest.skip("no host python3 for the rank wrapper (job_python) other than the plane's own")
    with accounts({"alice": ["teama"]}, ["teama"]) as acc, shared_dir("ty-slurm-term-") as d:
        pw = pwd.getpwnam(acc.user("alice"))
        who = Owner(pw.pw_name, pw.pw_uid, pw.pw_gid, (pw.pw_gid, acc.gid("teama")))
        work = d / "work"
        work.mkdir(mode=0o700)
        os.chown(work, who.uid, who.gid)
        data = d / "yard"
        data.mkdir(mode=0o711)
        be = SlurmBackend(data, env=cluster.env(), launch_timeout_s=120)
        ownership.prepare(JobDir(data / "jobs" / "1"), Identity(who, who.gid, None), [0])  # as the plane makes it
        spec = replace(make_spec(data, 1, ["sleep", "300"], ranks=[(0, "n1", (0,))], workdir=work), owner=who)
        try:
            be.launch(spec)
        except BackendError as e:
            raise AssertionError(f"{e}\n{(data / 'jobs' / '1' / 'logs' / 'rank-0.log').read_text()}") from e
        try:
            screen = Screen(be.open_terminal(1, 1, 0, ["sh", "-c", "id -un; exit 4"]))
            try:
                status = screen.finish(timeout=60)
            finally:
                screen.close()
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 4, screen.seen
            # srun's own "error: ... Exited with exit code 4" may come before or after the output
            assert who.user in screen.seen.split("\n"), screen.seen
        finally:
            be.release(1, 1)
            wait_until(lambda: marked_processes(data) == [], timeout=60, what="the ranks gone")
