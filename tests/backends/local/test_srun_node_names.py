"""A batch script's `srun` task on another emulated node than the script's has that node's name
(backends/local/node_name.py): `srun hostname` over two nodes prints both, the task runs as the
owner with the owner's groups and nothing more, and srun's signals, its kill on a failed task and
the cell's drain at the end still reach it. Real processes, a root plane in tmpfs mode, a real
throwaway owner; and the cases where the name stays the script's (dir mode, no user namespace).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.accounts import ROOT_ONLY, Accounts, accounts, shared_dir
from tests.backends.helpers import NODES, make_spec, marked_processes, wait_done, wait_until
from trainyard.backends import LocalBackend
from trainyard.backends.base import Owner
from trainyard.backends.local import node_name
from trainyard.contracts import JobInfo

pytestmark = ROOT_ONLY
TWO_NODES = ((0, "node0", (0,)), (1, "node1", (0,)))
INFO = JobInfo(name="names", team="vision", pool="default", job_class="training", cluster="test", tasks_per_node=1)
PY = "/usr/bin/python3"  # the owner's: the project's interpreter may be where owners cannot enter


@pytest.fixture(scope="module")
def acc() -> Iterator[Accounts]:
    with accounts({"alice": ["team"]}, ["team"]) as a:
        yield a


@pytest.fixture
def plane(acc: Accounts) -> Iterator[tuple[LocalBackend, Path, Owner]]:
    with shared_dir("tysrunnames-") as d:
        data = d / "data"
        data.mkdir(mode=0o711)
        (d / "work").mkdir()
        pw = pwd.getpwnam(acc.user("alice"))
        os.chown(d / "work", pw.pw_uid, pw.pw_gid)
        owner = Owner(pw.pw_name, pw.pw_uid, pw.pw_gid, (pw.pw_gid, acc.gid("team")))
        be = LocalBackend(data, NODES, private_tmp_mode="tmpfs")
        yield be, d, owner
        for a in be.poll():
            be.release(a.job_id, a.attempt)
        assert wait_until(lambda: marked_processes(data) == [], 10, "nothing of the jobs left")


def run_batch(be: LocalBackend, d: Path, job_id: int, body: str, owner: Owner | None, timeout: float = 30) -> str:
    """Run `body` as a 2-node batch script (as `owner`, or root); its log (every task's output)."""
    script = d / "work" / f"job{job_id}.sh"
    script.write_text("#!/bin/bash\n" + body)
    script.chmod(0o755)
    spec = make_spec(d / "data", job_id, ["/bin/bash", str(script)], ranks=TWO_NODES, workdir=d / "work")
    if owner is not None:  # task 1's log, the owner's, as the plane makes it (control/jobfiles/ownership.py)
        logs = Path(spec.job_dir) / "logs"
        logs.mkdir(parents=True)
        (logs / "rank-1.log").touch(0o640)
        os.chown(logs / "rank-1.log", owner.uid, owner.gid)
    be.launch(replace(spec, batch=True, job=INFO, owner=owner))
    state = wait_done(be, job_id, timeout=timeout)
    log = (d / "data" / "jobs" / str(job_id) / "logs" / "rank-0.log").read_text()
    assert [r.exit_code for r in state.ranks] == [0], log
    return log


def lines(log: str, tag: str) -> list[str]:
    return sorted(line.split(tag, 1)[1] for line in log.splitlines() if tag in line)


def test_srun_hostname_prints_both_nodes_and_each_task_is_the_owner_with_its_groups(plane, acc) -> None:
    be, d, owner = plane
    team = d / "work" / "team-only"
    team.write_text("team's\n")
    os.chown(team, 0, acc.gid("team"))
    team.chmod(0o640)  # root's, readable by the team's group only: a supplementary group of the owner
    log = run_batch(be, d, 1, "echo script=$(hostname)\n"
                              "srun bash -c 'echo H=$(hostname) N=$SLURMD_NODENAME U=$(id -un) "
                              "G=$(id -G | tr \" \" ,) R=$(cat team-only) S=$(stat -c %U /etc/hosts)'\n"
                              "srun -w node1 -N 1 hostname | sed s/^/W=/\n", owner)
    assert "script=node0" in log, log
    want = [f"H=node0 N=node0 U={owner.user} G={owner.gid},{acc.gid('team')} R=team's S=root",
            f"H=node1 N=node1 U={owner.user} G={owner.gid},65534 R=team's S=nobody"]
    assert lines(log, "H=") == [w.split("H=", 1)[1] for w in want], log
    assert lines(log, "W=") == ["node1"], log  # task 0 of a step on node1 only


def test_a_root_jobs_task_is_renamed_without_a_user_namespace(plane) -> None:
    be, d, _ = plane
    log = run_batch(be, d, 2, "srun bash -c 'echo H=$(hostname) $(id -u) $(awk \"{print \\$3}\" /proc/self/uid_map)'\n",
                    None)
    assert lines(log, "H=") == ["node0 0 4294967295", "node1 0 4294967295"], log  # the host's user namespace


def test_a_setuid_program_does_not_gain_in_a_renamed_task(plane) -> None:
    be, d, owner = plane
    mount = "/usr/bin/mount" if os.stat("/usr/bin/mount").st_mode & 0o4000 else None
    if mount is None:
        pytest.skip("no setuid mount here")
    log = run_batch(be, d, 3, "srun -w node1 -N 1 bash -c 'mount -t tmpfs x /mnt 2>&1; echo M=$?'\n", owner)
    assert "M=32" in log and "superuser" in log, log


TASK = """import os, signal, socket, sys, time
def term(*_):
    print("T=" + socket.gethostname(), flush=True)
    sys.exit(75)
signal.signal(signal.SIGTERM, term)
open("up." + os.environ["SLURM_PROCID"], "w").close()
if os.environ["SLURM_PROCID"] == "0" and sys.argv[1:] == ["fail"]:
    while not os.path.exists("up.1"):
        time.sleep(0.05)
    sys.exit(3)
time.sleep(100)
"""


def test_srun_forwards_signals_to_a_renamed_task_and_kills_it_when_another_fails(plane) -> None:
    be, d, owner = plane
    (d / "work" / "task.py").write_text(TASK)
    body = (f"srun {PY} task.py & pid=$!\n"
            "until [ -e up.0 ] && [ -e up.1 ]; do sleep 0.05; done\n"
            "kill -TERM $pid; wait $pid; echo forwarded=$?\n"
            f"rm up.*; srun {PY} task.py fail; echo failed=$?\n")
    log = run_batch(be, d, 4, body, owner)
    assert "forwarded=75" in log, log  # both tasks got srun's SIGTERM and asked to be requeued
    assert log.count("T=node1") == 2 and log.count("T=node0") == 1, log  # then task 1 killed by srun
    assert "failed=3" in log, log


def test_the_owner_outside_reads_and_traces_a_renamed_task_and_the_cells_drain_ends_it(plane) -> None:
    be, d, owner = plane
    trace = "strace -p $t -e trace=none -o /dev/null & s=$!; sleep 0.3; kill $s; wait $s; true\n" \
        if shutil.which("strace") else ""
    log = run_batch(be, d, 5, "srun -w node1 -N 1 bash -c 'echo H=$(hostname); echo $$ > up.5; exec sleep 300' &\n"
                              "until [ -s up.5 ]; do sleep 0.05; done; t=$(cat up.5)\n"
                              "tr '\\0' '\\n' < /proc/$t/environ | grep SLURMD_NODENAME\n" + trace, owner)
    assert "H=node1" in log and "SLURMD_NODENAME=node1" in log, log  # /proc/PID/environ: ptrace's read check
    assert not trace or re.search(r"strace: Process \d+ attached", log), log  # ptrace's attach check
    assert wait_until(lambda: marked_processes(d / "data") == [], 10, "the task drained")


def test_dir_mode_keeps_the_hosts_name_for_every_task(acc) -> None:
    with shared_dir("tysrunnames-") as d:
        data = d / "data"
        data.mkdir(mode=0o711)
        (d / "work").mkdir(mode=0o777)
        be = LocalBackend(data, NODES, private_tmp_mode="dir")
        try:
            log = run_batch(be, d, 6, "srun bash -c 'echo H=$(hostname)'\n", None)
        finally:
            for a in be.poll():
                be.release(a.job_id, a.attempt)
    assert lines(log, "H=") == [os.uname().nodename] * 2, log


def test_a_task_stays_under_the_scripts_name_where_no_namespace_can_be_made(tmp_path, monkeypatch) -> None:
    names = node_name.Renamer(os.uname().nodename, ["node1"])
    assert names.preexec(os.uname().nodename) is None and names.preexec("elsewhere") is None
    monkeypatch.setattr(names, "_unshare", lambda flags: -1)  # as with user.max_user_namespaces = 0
    out = subprocess.run(["hostname"], preexec_fn=names.preexec("node1"), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == os.uname().nodename
    real = node_name.Renamer(os.uname().nodename, ["node1"])
    out = subprocess.run(["hostname"], preexec_fn=real.preexec("node1"), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "node1" and os.uname().nodename != "node1"  # the parent's name untouched


def test_renamer_only_where_the_cell_is_named_and_hosts_maps_the_node(tmp_path, monkeypatch) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n# 127.0.0.1 commented\n127.0.0.1 node0 node1  # emulated\n")
    assert node_name.hosts_names(str(hosts)) == {"localhost", "node0", "node1"}
    assert node_name.hosts_names(str(tmp_path / "none")) == set()
    assert node_name.renamer("not-" + os.uname().nodename) is None
    r = node_name.renamer(os.uname().nodename)
    assert r is not None and r.preexec("surely-not-in-etc-hosts") is None

