"""Jobs run as their owners under a real Slurm (tests/slurm_cluster.py, with slurmdbd accounting and
associations made by sacctmgr), with real Unix accounts (tests/accounts.py).

The plane runs in this process on the Slurm backend: `sbatch` runs as the job's owner
(`runuser -u`) with `--account=<team>`, so Slurm's own records (squeue, sacct) show the real user
and account, and `AccountingStorageEnforce=associations` refuses what the user may not charge. The
job's environment reaches the job only (job-env.json), never the plane's own commands: a job that
puts a hostile `sbatch` first on its PATH and sets SBATCH_ACCOUNT/PARTITION/QOS/EXCLUSIVE changes
nothing the plane runs or charges.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.accounts import ROOT_ONLY, Accounts, accounts, shared_dir
from tests.plane import FIXTURES, Plane, job_dir
from tests.slurm_cluster import SlurmCluster, accounting_available, slurm_available
from trainyard.jobfs import read_record as read_json
from trainyard.backends.rundir import job_tools
from trainyard.backends.slurm.backend import SlurmBackend

pytestmark = [ROOT_ONLY, pytest.mark.xdist_group("slurm-owners")]

DENIED = "Permission denied"


def config(acc: Accounts) -> str:
    text = (FIXTURES / "slurm_two_teams.yaml").read_text()
    text = text.replace("  - name: vision\n", f"  - name: vision\n    group: {acc.group('vis')}\n")
    text = text.replace("  - name: nlp\n", f"  - name: nlp\n    group: {acc.group('nlp')}\n")
    return text + f"users:\n  alice: {acc.user('alice')}\n  bob: {acc.user('bob')}\n"


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Plane, SlurmCluster, Accounts]]:
    for why in (slurm_available(), accounting_available()):
        if why:
            pytest.skip(why)
    if job_tools.default_python() == sys.executable:
        pytest.skip("no host python3 for the rank wrapper (job_python) other than the plane's own")
    with accounts({"alice": ["vis"], "bob": ["nlp"]}, ["vis", "nlp"]) as acc, shared_dir("ty-slurm-owners-") as d:
        cluster = SlurmCluster(d / "slurm", accounting=True).start()
        try:
            cluster.add_association(acc.user("alice"), "vision")
            cluster.add_association(acc.user("bob"), "nlp")
            cfg = d / "cluster.yaml"
            cfg.write_text(config(acc))
            (d / "yard").mkdir()
            backend = SlurmBackend(d / "yard", env=cluster.env())  # job_python: the host's python3
            p = Plane(d / "yard", config=cfg, backend=backend, run_as=None, allow_root_jobs=None, kill_wait_s=5.0)
            try:
                yield p, cluster, acc
            finally:
                p.stop()
        finally:
            cluster.stop()


def log_of(p: Plane, job_id: int) -> str:
    return (job_dir(p.cp.data_dir, job_id) / "logs" / "rank-0.log").read_text()


def slurm_id(p: Plane, job_id: int) -> int:
    """The Slurm job of the attempt (RUNNING is committed before the launch: wait for its record)."""
    deadline = time.monotonic() + 30
    while (rec := read_json(job_dir(p.cp.data_dir, job_id) / "run" / "attempt-1" / "attempt.json")) is None:
        assert time.monotonic() < deadline, "no attempt.json"
        time.sleep(0.05)
    return int(rec["slurm_job_id"])


def sacct(cluster: SlurmCluster, name: str) -> list[str]:
    """User, account, partition and state of the job's first attempt in Slurm's accounting, by the
    job's name, which the backend gives its batch job (the run dir, with the Slurm id, is gone once
    it ended); each test names its job apart."""
    deadline = time.monotonic() + 30
    while True:  # slurmctld sends the record to slurmdbd a moment after the job ends
        out = cluster.run("sacct", f"--name={name}", "-a", "-X", "-n", "-P", "-S", "now-1hour",
                          "-o", "User,Account,Partition,State").stdout
        if out.strip() and out.split("|")[3].strip() not in ("RUNNING", "PENDING", ""):
            return out.strip().split("|")
        assert time.monotonic() < deadline, out
        time.sleep(0.3)


def test_a_job_of_alice_runs_under_slurm_as_alice_charged_to_her_team(world):
    p, cluster, acc = world
    alice = p.as_user("alice", "member", "vision")
    j = p.submit(alice, command=["/bin/sh", "-c", "id -un; id -Gn; echo $SLURM_JOB_ACCOUNT; sleep 2"],
                 time="10m", name="owners-alice")["id"]
    p.wait(j, "RUNNING", timeout=60)
    sid = slurm_id(p, j)
    queue = cluster.run("squeue", "-h", "-j", str(sid), "-o", "%u %a").stdout.split()
    assert queue == [acc.user("alice"), "vision"]
    limit = cluster.job_info(sid)["TimeLimit"]
    assert limit not in ("UNLIMITED", "") and limit >= "00:10:00", limit  # the plane's limit plus its grace
    assert p.wait(j, ("COMPLETED", "FAILED"), timeout=60)["state"] == "COMPLETED", log_of(p, j)
    lines = log_of(p, j).splitlines()[1:]
    assert lines[0] == acc.user("alice") and acc.group("vis") in lines[1].split() and lines[2] == "vision"
    assert sacct(cluster, "owners-alice")[:2] == [acc.user("alice"), "vision"]


def test_a_hostile_path_and_sbatch_variables_change_nothing_the_plane_runs_or_charges(world, tmp_path_factory):
    p, cluster, acc = world
    alice = p.as_user("alice", "member", "vision")
    evil = p.cp.data_dir.parent / "evil"
    evil.mkdir(exist_ok=True)
    evil.chmod(0o755)
    marker = p.cp.data_dir.parent / "evil-ran"
    for cmd in ("sbatch", "srun", "scontrol", "squeue", "scancel", "runuser", "python3"):
        f = evil / cmd
        f.write_text(f"#!/bin/sh\necho {cmd} >> {marker}\nexit 1\n")
        f.chmod(0o755)
    env = {"PATH": f"{evil}:/usr/bin:/bin", "SBATCH_ACCOUNT": "nlp", "SBATCH_PARTITION": "nosuch",
           "SBATCH_QOS": "nosuch", "SBATCH_EXCLUSIVE": "1", "SBATCH_TIMELIMIT": "1", "SLURM_CONF": "/nonexistent",
           "LD_PRELOAD": "/nonexistent.so"}
    j = p.submit(alice, command=["/bin/sh", "-c", 'echo "path=$PATH"; echo "acct=$SBATCH_ACCOUNT"'], env=env,
                 name="owners-hostile")["id"]
    assert p.wait(j, ("COMPLETED", "FAILED"), timeout=60)["state"] == "COMPLETED", log_of(p, j)
    assert not marker.exists(), marker.read_text()  # nothing of the job's PATH ran, as the plane or as a task
    lines = log_of(p, j).splitlines()[1:]
    assert f"path={evil}:/usr/bin:/bin" in lines and "acct=nlp" in lines  # the job's environment is the job's
    user, account, partition, state = sacct(cluster, "owners-hostile")
    # (the batch job itself may read CANCELLED: the backend's release cancels what is left of it)
    assert (user, account, partition) == (acc.user("alice"), "vision", "main"), state


def test_bob_cannot_read_alices_job_env_or_run_dir_under_slurm(world):
    p, cluster, acc = world
    alice = p.as_user("alice", "member", "vision")
    bob = p.as_user("bob", "member", "nlp")
    secret = "s3cr3t-" + acc.prefix
    a = p.submit(alice, command=["/bin/sh", "-c", "sleep 60"], env={"ALICE_SECRET": secret})["id"]
    p.wait(a, "RUNNING", timeout=60)
    run = job_dir(p.cp.data_dir, a) / "run" / "attempt-1"
    probe = f"cat {run}/job-env.json 2>&1; ls {run} 2>&1; cat {job_dir(p.cp.data_dir, a)}/logs/rank-0.log 2>&1; true"
    b = p.submit(bob, command=["/bin/sh", "-c", probe])["id"]
    assert p.wait(b, ("COMPLETED", "FAILED"), timeout=60)["state"] == "COMPLETED", log_of(p, b)
    out = log_of(p, b)
    assert secret not in out and out.count(DENIED) >= 3, out
    assert bob.get(f"/api/v1/jobs/{a}/logs").status_code == 403
    p.admin.post(f"/api/v1/jobs/{a}/cancel")
    p.wait(a, "CANCELLED", timeout=60)


def test_a_batch_script_of_alice_runs_once_as_alice_and_its_srun_tasks_too(world):
    """The script form (`LaunchSpec.batch`): the batch step and the tasks of its (Slurm's) srun run
    as the owner, and read the job's environment from her 0600 job-env.json."""
    p, cluster, acc = world
    alice = p.as_user("alice", "member", "vision")
    script = ('#!/bin/bash\necho "batch $(id -un) $ALICE_VAR"\n'
              'srun /bin/sh -c \'echo "task $SLURM_PROCID $(id -un) $ALICE_VAR"\'\nexit 4\n')
    j = p.submit(alice, script=script, command=[], env={"ALICE_VAR": "hers"})["id"]
    job = p.wait(j, ("COMPLETED", "FAILED"), timeout=90)
    out = log_of(p, j)
    assert job["state"] == "FAILED" and "4" in job["reason"], (job["reason"], out)
    me = acc.user("alice")
    assert out.count(f"batch {me} hers") == 1 and f"task 0 {me} hers" in out, out


def test_the_rank_wrapper_runs_from_the_attempts_copy_with_job_python_not_the_planes_python(world):
    """The plane's interpreter and package may be where owners cannot enter (a venv under /root,
    0700): each attempt's `slurm/task.py` (and what it loads) is a copy in its run dir, root's
    and 0644, run by job_python (by default the host's python3), so alice's job starts and runs."""
    p, cluster, acc = world
    alice = p.as_user("alice", "member", "vision")
    j = p.submit(alice, command=["/bin/sh", "-c", "id -un; sleep 30"], name="owners-wrapper")["id"]
    p.wait(j, "RUNNING", timeout=60)
    run = job_dir(p.cp.data_dir, j) / "run" / "attempt-1"
    deadline = time.monotonic() + 30
    while "alice" not in (text := log_of(p, j)) and acc.user("alice") not in text:
        assert time.monotonic() < deadline, text
        time.sleep(0.1)
    batch = (run / "batch.sh").read_text()
    copy = job_tools.copied(run, "backends/slurm/task.py")
    assert f"{job_tools.default_python()} -I -S {copy} " in batch, batch
    assert sys.executable not in batch and os.path.realpath(sys.executable) not in batch, batch
    for rel in job_tools.SLURM_TASK_FILES:
        st = job_tools.copied(run, rel).stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o644), rel
    assert acc.user("alice") in log_of(p, j).splitlines()
    plane_py = os.path.realpath(sys.executable)
    if job_tools._blocked(plane_py, acc.uid("alice"), {acc.gid("vis")}) is not None:  # the premise, where it holds
        r = subprocess.run(["runuser", "-u", acc.user("alice"), "--", plane_py, "-c", "1"], capture_output=True)
        assert r.returncode != 0
    p.admin.post(f"/api/v1/jobs/{j}/cancel")
    p.wait(j, "CANCELLED", timeout=60)
