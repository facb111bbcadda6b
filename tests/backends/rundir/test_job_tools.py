"""The in-job tools as a job's owner runs them: a batch script of a real non-root account whose
`srun` works although the plane's interpreter lives where the account cannot enter (/root, 0700,
here); srun's -w, -l and --gpus-per-task; `scontrol show job`, `squeue`, `sinfo`; and `yard up`
refusing to start (exit 2, what to fix) when job owners cannot execute its job_python.
Real processes, the real local backend, real Unix accounts (tests/accounts.py)."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from trainyard.backends import LocalBackend
from trainyard.backends.rundir import job_tools
from trainyard.backends.base import Owner
from trainyard.contracts import JobInfo

from tests.accounts import ROOT_ONLY, accounts, shared_dir
from tests.backends.helpers import NODES, make_spec, marked_processes, wait_done
from tests.plane import YARD

SYS_PY = job_tools.default_python()  # what owners run; the plane's own may be unreachable
TWO_NODES = ((0, "node0", (0, 1)), (1, "node1", (0, 1)))
FOUR = ((0, "node0", (0,)), (1, "node0", (1,)), (2, "node1", (0,)), (3, "node1", (1,)))
INFO = JobInfo(name="tools", team="nlp", pool="default", job_class="training", cluster="test", submit_host="login1")


def batch(data: Path, job_id: int, body: str, ranks=TWO_NODES, owner: Owner | None = None, **kw):  # noqa: ANN001, ANN201
    script = data / f"job{job_id}.sbatch"
    script.write_text("#!/bin/bash\n" + body)
    script.chmod(0o755)
    spec = make_spec(data, job_id, ["/bin/bash", str(script)], ranks=ranks, workdir=data, **kw)
    logs = data / "jobs" / str(job_id) / "logs"
    logs.mkdir(parents=True)
    if owner is not None:  # as the plane's launch step leaves it: the owner writes its tasks' logs
        for d in (logs.parent, logs):
            os.chown(d, owner.uid, owner.gid)
    return replace(spec, batch=True, job=INFO, owner=owner, time_limit_s=3600)


def log(data: Path, job_id: int, rank: int = 0) -> str:
    return (data / "jobs" / str(job_id) / "logs" / f"rank-{rank}.log").read_text()


def test_srun_label_nodelist_and_gpus_per_task(backend, tmp_path):
    body = ("srun -l -w node1 hostname >/dev/null && echo nodelist-ok\n"
            "srun --label sh -c 'echo hello'\n"
            "srun --nodes=1 --ntasks=1 -w node1 sh -c 'echo on $SLURMD_NODENAME $SLURM_STEP_NODELIST'\n"
            "srun -w node7 true; echo stray=$?\n"
            "srun --gpus-per-task=1 sh -c 'echo gpt $SLURM_PROCID $CUDA_VISIBLE_DEVICES $SLURM_GPUS_PER_TASK'\n"
            "srun --gpus-per-task=2 true; echo toomany=$?\n")
    backend.launch(batch(tmp_path, 1, body, ranks=FOUR))
    assert wait_done(backend, 1, timeout=60).ranks[0].exit_code == 0
    out = log(tmp_path, 1)
    assert "nodelist-ok" in out
    assert sorted(x for x in out.splitlines() if x.endswith(": hello")) == [f"{r}: hello" for r in range(4)]
    assert "on node1 node1" in out
    assert "-w node7: not in this job's allocation (node0, node1)" in out and "stray=1" in out
    gpt = sorted(x for x in out.splitlines() if x.startswith("gpt "))
    assert gpt == ["gpt 0 0 1", "gpt 1 1 1", "gpt 2 0 1", "gpt 3 1 1"]  # each task its own GPU
    assert "--gpus-per-task 2: 2 task(s) on node0 need 4 GPU(s); the job has 2 there" in out and "toomany=1" in out


def test_scontrol_show_job_squeue_and_sinfo_answer_for_this_job(backend, tmp_path):
    body = ("scontrol show job $SLURM_JOB_ID\nscontrol show job\nscontrol show job 999 || echo other=$?\n"
            "squeue\nsqueue -h -j $SLURM_JOB_ID -o '%i|%u|%t|%D|%N|%l|%P'\nsqueue -h -j 999; echo none=$?\n"
            "squeue --me -h -o %i\nsinfo\nsinfo -h -N\nsqueue --bogus || echo bad=$?\n")
    backend.launch(batch(tmp_path, 2, body))
    assert wait_done(backend, 2, timeout=30).ranks[0].exit_code == 0
    out = log(tmp_path, 2)
    user = "root" if os.geteuid() == 0 else os.environ.get("USER", "")
    first = out.split("JobId=2 JobName=tools\n", 1)[1]
    for kv in (f"UserId={user}(", "Account=nlp QOS=training", "JobState=RUNNING", "TimeLimit=01:00:00",
               "Partition=default", "BatchHost=node0", "NodeList=node[0-1]", "NumNodes=2 NumCPUs=2 NumTasks=2",
               f"WorkDir={tmp_path}", f"StdOut={tmp_path}/jobs/2/logs/rank-0.log", "TRES=cpu=2,node=2,gres/gpu=4"):
        assert kv in first, kv
    assert out.count("JobId=2 JobName=tools") == 2
    assert "Invalid job id specified: 999" in out and "other=1" in out
    lines = out.splitlines()
    header = next(x for x in lines if "JOBID" in x)
    assert header.split() == ["JOBID", "PARTITION", "NAME", "USER", "ST", "TIME", "NODES", "NODELIST(REASON)"]
    row = lines[lines.index(header) + 1].split()
    assert row[0] == "2" and row[1] == "default" and row[4] == "R" and row[6] == "2" and row[7] == "node[0-1]"
    assert f"2|{user}|R|2|node[0-1]|01:00:00|default" in lines
    assert "none=0" in out and lines[lines.index("none=0") - 1] != "2"
    assert lines[lines.index("none=0") + 1] == "2"  # --me: this job is the caller's own
    sinfo = next(x for x in lines if x.startswith("PARTITION"))
    assert sinfo.split() == ["PARTITION", "AVAIL", "TIMELIMIT", "NODES", "STATE", "NODELIST"]
    assert lines[lines.index(sinfo) + 1].split() == ["default*", "up", "infinite", "2", "mix", "node[0-1]"]
    assert "node0         1 default*  mix" in out  # sinfo -N -h: a line a node
    assert "unrecognized option '--bogus'" in out and "bad=1" in out


@ROOT_ONLY
def test_a_non_root_owners_batch_job_runs_its_tools_though_the_planes_python_is_out_of_reach():
    plane_py = os.path.realpath(sys.executable)
    blocked = job_tools._blocked(plane_py, 65534, {65534})
    with accounts({"own": []}, []) as acc, shared_dir("tytools") as data:
        be = LocalBackend(data, NODES)
        try:
            pw = acc.uid("own")
            owner = Owner(acc.user("own"), pw, pwd.getpwuid(pw).pw_gid)
            body = ("id -un\nsrun -l sh -c 'echo rank $SLURM_PROCID of $SLURM_NTASKS as $(id -un)'\n"
                    "scontrol show hostnames | head -n 1\nsqueue -h -o '%i %u'\n")
            be.launch(batch(data, 3, body, owner=owner))
            state = wait_done(be, 3, timeout=30)
            out = log(data, 3)
            assert state.ranks[0].exit_code == 0, out
            who = acc.user("own")
            assert f"0: rank 0 of 2 as {who}" in out and f"1: rank 1 of 2 as {who}" in out
            assert "node0\n" in out and f"3 {who}" in out
            run = data / "jobs" / "3" / "run" / "attempt-1"
            if run.exists():  # the tools are root's, the owner may read and not change them
                st = (run / "tools" / "trainyard" / "backends" / "local" / "srun.py").stat()
                assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o644
            if blocked is not None:  # the plane's own interpreter is out of the owner's reach here
                r = subprocess.run(["runuser", "-u", who, "--", plane_py, "-c", "1"], capture_output=True)
                assert r.returncode != 0
        finally:
            for a in be.poll():
                be.release(a.job_id, a.attempt)
            assert marked_processes(data) == []


@ROOT_ONLY
def test_yard_up_refuses_an_interpreter_job_owners_cannot_execute(tmp_path):
    plane_py = os.path.realpath(sys.executable)
    if job_tools._blocked(plane_py, 65534, {65534}) is None:
        pytest.skip(f"{plane_py} is reachable by every account on this host")
    data = tmp_path / "d"
    p = subprocess.run([YARD, "up", "--data-dir", str(data), "--port", "0", "--nodes", "1", "--job-python", plane_py],
                       capture_output=True, text=True, timeout=120)
    top = "/" + plane_py.split("/")[1]
    assert p.returncode == 2, p.stderr
    assert f"job owners cannot execute {plane_py} (job_python)" in p.stderr and "as nobody" in p.stderr
    assert f"{top} is " in p.stderr and f"set job_python: {SYS_PY}" in p.stderr, p.stderr
    p = subprocess.run([YARD, "up", "--data-dir", str(data), "--port", "0", "--job-python", "python3"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--job-python: python3 is not an absolute path" in p.stderr, p.stderr


def test_the_default_interpreter_is_the_hosts_python3():
    assert job_tools.resolve(None) == SYS_PY and job_tools.resolve("/opt/py/bin/python3") == "/opt/py/bin/python3"
    assert SYS_PY in job_tools.CANDIDATES or SYS_PY == sys.executable


def test_copy_files_makes_the_planes_copies_and_never_writes_through_a_link(tmp_path):
    """The Slurm backend's rank wrapper and what it loads, copied into a run dir: the package's
    very bytes, files 0644 in 0755 dirs; a `tools` the owner left there (a link) is refused."""
    run = tmp_path / "run"
    run.mkdir()
    job_tools.copy_files(run, job_tools.SLURM_TASK_FILES)
    for rel in job_tools.SLURM_TASK_FILES:
        f = job_tools.copied(run, rel)
        assert f.read_bytes() == (job_tools.PKG / rel).read_bytes() and stat.S_IMODE(f.stat().st_mode) == 0o644
        assert stat.S_IMODE(f.parent.stat().st_mode) == 0o755
    r = subprocess.run([job_tools.default_python(), "-I", "-S", str(job_tools.copied(run, "backends/slurm/task.py"))],
                       capture_output=True, text=True, cwd="/")  # imports its siblings from the copy alone
    assert "usage: slurm/task.py" in r.stderr and "Traceback" not in r.stderr, r.stderr
    other = tmp_path / "other"
    other.mkdir()
    (other / "tools").mkdir()
    (tmp_path / "run2").mkdir()
    os.symlink(other, tmp_path / "run2" / "tools")
    with pytest.raises(OSError):
        job_tools.copy_files(tmp_path / "run2", job_tools.SLURM_TASK_FILES)
    assert list((other / "tools").iterdir()) == []
