"""Issue 35, acceptance line 3: the published scripts of tests/corpus/ (the shape of torchtitan's
multi-node Slurm launcher, and a site template with --hint=nomultithread, --distribution=block,
--tmp and --output=%x-%j.out) run unchanged through a real `yard up` (as root), on the local backend
and on the real Slurm test cluster, as a real non-root owner, with the plane's Python where that
owner cannot enter.

The owner is a throwaway Unix account (tests/accounts.py) in the team's group; its token user
(`carl`) maps to it through `users:`. The scripts and tiny_gloo.py are copied, byte for byte, into
a directory the account owns (mode 0700, as a home directory), and the account itself submits them
from there with `yard submit SCRIPT`, as it would run `sbatch SCRIPT`: `runuser` and an interpreter
it can reach (`python_for_accounts`), never root's. So the submission is the account's in every
way a site's would be: its working directory, its environment (exported with `--export=ALL`, the
default), a file only it can read. Its PyTorch is the site's (PATH and PYTHONPATH, as `module load
pytorch` would give, see tests/corpus/test_corpus.py).

Both scripts are submitted at once and run side by side (the multi-node one takes 2 GPUs on each
node, the template none). What must hold on both backends: COMPLETED with exit 0, every rank's
parameters in sync, the template's `%x-%j.out` in the submit directory and owned by the account,
every rank's uid the account's, and the premise itself: the account cannot enter the directory of
the plane's interpreter.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.accounts import ROOT_ONLY, Accounts, accounts, python_for_accounts, shared_dir
from tests.yard_cluster import YardCluster
from trainyard.ports import free_port
from tests.scenarios.host_nodes import HEAD, NODES

pytestmark = [ROOT_ONLY, pytest.mark.slow]

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
SCRIPTS = ("multinode_torchrun.sbatch", "site_template.sbatch")
DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
PATIENCE_S = 150.0


TOKEN_USER = "carl"


def _config(acc: Accounts) -> str:
    return textwrap.dedent(f"""\
        cluster:
          name: corpus-owner
          nodes:
            - {{name: {NODES[0]}, gpus: 4, gpu_model: a100, gpu_mem_gb: 16}}
            - {{name: {NODES[1]}, gpus: 4, gpu_model: a100, gpu_mem_gb: 16}}
        teams:
          - name: corpus
            group: {acc.group("team")}
            quotas:
              default: {{nominal: 8}}
        classes:
          - {{name: training, priority: 100}}
        default_class: training
        users:
          {TOKEN_USER}: {acc.user("owner")}
        """)


@dataclass
class World:
    yc: YardCluster
    acc: Accounts
    work: Path  # the account's submit directory
    python: tuple[str, str]  # (an interpreter the account may run, its PYTHONPATH)
    token: str


@pytest.fixture(params=["local", pytest.param("slurm", marks=pytest.mark.slurm)])
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    if request.param == "slurm" and HEAD is None:
        pytest.skip(f"the host name {socket.gethostname()!r} does not resolve: Slurm's head node needs a "
                    "name that does (Slurm takes NodeName=localhost for the host itself)")
    py = python_for_accounts()
    if py is None:
        pytest.skip("no interpreter other accounts may run has trainyard and PyTorch here")
    with accounts({"owner": ["team"]}, ["team"]) as acc, shared_dir("tycorpown") as d:
        pw = pwd.getpwnam(acc.user("owner"))
        work = d / "home"
        work.mkdir(mode=0o700)
        for name in (*SCRIPTS, "tiny_gloo.py"):
            shutil.copyfile(CORPUS / name, work / name)
            os.chown(work / name, pw.pw_uid, pw.pw_gid)
        os.chown(work, pw.pw_uid, pw.pw_gid)
        config = d / "corpus.yaml"
        config.write_text(_config(acc))
        yc = YardCluster(d / "cluster", request.param, config_file=config, slurm_nodes=NODES,
                         slurm_options={"gpu_type": "a100"})
        try:
            r = yc.http.post("/api/v1/tokens", json={"user": TOKEN_USER, "role": "member", "team": "corpus"})
            assert r.status_code == 201, r.text
            yield World(yc, acc, work, py, r.json()["token"])
        finally:
            yc.stop()


def _site(w: World) -> Path:
    """The site's PyTorch as a module system gives it: `torchrun` and `python3` on PATH, wrappers of
    an interpreter the account may run (root's own, under /root, it may not)."""
    site = w.work.parent / "site" / "bin"
    site.mkdir(parents=True)
    exe = w.python[0]
    for name, body in (("torchrun", f'exec {exe} -m torch.distributed.run "$@"'), ("python3", f'exec {exe} "$@"')):
        (site / name).write_text(f"#!/bin/sh\n{body}\n")
        (site / name).chmod(0o755)
    (w.work.parent / "site").chmod(0o755)
    return site


def _as_owner(w: World, site: Path, *args: str) -> subprocess.CompletedProcess:
    """`yard ARGS` run by the account itself, from its submit directory, with its own environment
    only (env -i: nothing of root's leaks into what `--export=ALL` sends)."""
    env = {"PATH": f"{site}:/usr/bin:/bin", "PYTHONPATH": w.python[1], "YARD_URL": w.yc.server.url,
           "YARD_TOKEN": w.token, "RDZV_PORT": str(free_port("127.0.0.1")), "LANG": "C.UTF-8",
           "OMP_NUM_THREADS": "1"}
    if w.yc.slurm is not None:  # a site's login shell finds its slurm.conf; this cluster's is here
        env.update(w.yc.slurm.env())
    cmd = ["runuser", "-u", w.acc.user("owner"), "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()),
           w.python[0], "-m", "trainyard.cli.main", *args]
    return subprocess.run(cmd, cwd=w.work, capture_output=True, text=True, timeout=120)


def _wait(w: World, ids: dict[str, int]) -> dict[str, dict]:
    deadline = time.monotonic() + PATIENCE_S
    while True:
        jobs = {n: w.yc.job(i) for n, i in ids.items()}
        left = [f"{n} {j['state']} ({j['reason']})" for n, j in jobs.items() if j["state"] not in DONE]
        if not left:
            return jobs
        assert time.monotonic() < deadline, f"{w.yc.backend}: not ended after {PATIENCE_S}s: {left}"
        time.sleep(0.5)


def _plane_python(w: World) -> Path:
    """The interpreter the running `yard up` is (its /proc exe), the directory it lives in."""
    return Path(os.readlink(f"/proc/{w.yc.server.proc.pid}/exe")).parent


def _may_enter(w: World, path: Path) -> bool:
    """os.access(path, X_OK) as the account (its real uid, through runuser)."""
    r = subprocess.run(["runuser", "-u", w.acc.user("owner"), "--", "/usr/bin/python3", "-c",
                        "import os, sys; print(os.access(sys.argv[1], os.X_OK))", str(path)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip() == "True"


def test_the_corpus_runs_unchanged_as_a_non_root_owner(world: World) -> None:
    w = world
    uid = pwd.getpwnam(w.acc.user("owner")).pw_uid
    plane_py = _plane_python(w)
    assert not _may_enter(w, plane_py), f"the premise: {w.acc.user('owner')} must not enter {plane_py}"
    assert _may_enter(w, w.work)  # (the probe can say yes)
    site = _site(w)
    ids: dict[str, int] = {}
    for name in SCRIPTS:
        assert (w.work / name).read_bytes() == (CORPUS / name).read_bytes()  # unchanged
        r = _as_owner(w, site, "submit", name)
        assert r.returncode == 0, f"yard submit {name} as the owner: rc {r.returncode}\n{r.stdout}\n{r.stderr}"
        ids[name] = int(re.search(r"Submitted (?:batch )?job (\d+)", r.stdout).group(1))
    jobs = _wait(w, ids)
    logs = {n: w.yc.yard("logs", str(i), check=False).stdout for n, i in ids.items()}
    wrong = [f"{n}: {j['state']} exit {j.get('exit_code')} ({j['reason']})\n{logs[n][-3000:]}"
             for n, j in jobs.items() if (j["state"], j.get("exit_code") or 0) != ("COMPLETED", 0)]
    assert not wrong, f"{w.yc.backend}: " + "\n".join(wrong)
    for j in jobs.values():
        assert j["user"] == TOKEN_USER, j

    multi = logs["multinode_torchrun.sbatch"]
    assert "Node IP: " in multi, multi
    ranks = sorted(x for x in multi.splitlines() if x.startswith("rank "))
    assert ranks == [f"rank {r}/4 steps 3 in-sync True" for r in range(4)], multi
    assert sorted(re.findall(r"^owner rank (\d) uid (\d+)$", multi, re.M)) == [(str(r), str(uid)) for r in range(4)], multi
    default_out = w.work / f"slurm-{ids['multinode_torchrun.sbatch']}.out"  # no --output: sbatch's default name
    assert default_out.exists() and default_out.lstat().st_uid == uid, sorted(p.name for p in w.work.iterdir())

    # --output=%x-%j.out: in the submit directory, the account's (a link to the job's log, as
    # docs/control-plane.md says, is the account's link), and the account reads it there
    out = w.work / f"site_template-{ids['site_template.sbatch']}.out"
    assert out.exists(), sorted(p.name for p in w.work.iterdir())
    st = out.lstat()
    assert st.st_uid == uid, (out, st.st_uid, uid)
    if out.is_symlink():
        target = out.resolve()
        assert target.stat().st_uid == uid, (target, target.stat().st_uid, uid)
    r = subprocess.run(["runuser", "-u", w.acc.user("owner"), "--", "cat", str(out)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "(2 nodes, 2 tasks)" in text and "NumNodes=2" in text, text
    assert sorted(x for x in text.splitlines() if "in-sync" in x) == [
        f"{r}: rank {r}/2 steps 2 in-sync True" for r in range(2)], text
    assert sorted(re.findall(r"^(\d): owner rank \d uid (\d+)$", text, re.M)) == [(str(r), str(uid)) for r in range(2)], text
    assert text.rstrip().endswith("done"), text
