"""Published-style batch scripts, run unchanged on the local backend as a real non-root account,
with the plane's Python where that account cannot enter (here /root, 0700): the shape of
torchtitan's multi-node launcher (scontrol show hostnames, srun -w for the head's address, srun
torchrun with a c10d rendezvous) and a site template (--hint, --distribution, --tmp, --output,
--time). The training is a tiny CPU step over gloo (tiny_gloo.py). The site's environment gives
the account its PyTorch (PATH and PYTHONPATH, as `module load pytorch` would)."""

from __future__ import annotations

import os
import pwd
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from trainyard.backends import LocalBackend
from trainyard.backends.base import Owner
from trainyard.contracts import JobInfo
from trainyard.ports import free_port

from tests.accounts import ROOT_ONLY, accounts, python_for_accounts, shared_dir
from tests.backends.helpers import NODES, make_spec, marked_processes, wait_done

HERE = Path(__file__).parent
TWO_NODES = ((0, "node0", (0, 1)), (1, "node1", (0, 1)))
pytestmark = [ROOT_ONLY, pytest.mark.slow]


def _site(data: Path) -> dict[str, str]:
    """A PATH with `torchrun` and `python3` the account may run, and the PYTHONPATH of PyTorch."""
    found = python_for_accounts()
    if found is None:
        pytest.skip("no interpreter other accounts may run has PyTorch here")
    exe, path = found
    site = data / "site" / "bin"
    site.mkdir(parents=True)
    for name, body in (("torchrun", f'exec {exe} -m torch.distributed.run "$@"'), ("python3", f'exec {exe} "$@"')):
        (site / name).write_text(f"#!/bin/sh\n{body}\n")
        (site / name).chmod(0o755)
    (data / "site").chmod(0o755)
    return {"PATH": f"{site}:/usr/bin:/bin", "PYTHONPATH": path, "RDZV_PORT": str(free_port("127.0.0.1"))}


def _run(name: str, job_id: int) -> tuple[int, str]:
    with accounts({"corp": []}, []) as acc, shared_dir("tycorpus") as data:
        shutil.copy(HERE / name, data / name)
        shutil.copy(HERE / "tiny_gloo.py", data / "tiny_gloo.py")
        for f in (name, "tiny_gloo.py"):
            (data / f).chmod(0o644)
        env = _site(data)
        pw = pwd.getpwnam(acc.user("corp"))
        owner = Owner(acc.user("corp"), pw.pw_uid, pw.pw_gid)
        logs = data / "jobs" / str(job_id) / "logs"
        logs.mkdir(parents=True)
        for d in (logs.parent, logs):
            os.chown(d, owner.uid, owner.gid)
        spec = make_spec(data, job_id, ["/bin/bash", str(data / name)], ranks=TWO_NODES, env=env, workdir=data)
        spec = replace(spec, batch=True, owner=owner, time_limit_s=600,
                       job=JobInfo(name=name.split(".")[0], team="corpus", pool="default", cluster="test"))
        be = LocalBackend(data, NODES)
        try:
            be.launch(spec)
            state = wait_done(be, job_id, timeout=180)
            return state.ranks[0].exit_code, (logs / "rank-0.log").read_text()
        finally:
            for a in be.poll():
                be.release(a.job_id, a.attempt)
            assert marked_processes(data) == []


def test_the_torchtitan_shaped_multinode_script_runs_as_a_non_root_owner():
    code, out = _run("multinode_torchrun.sbatch", 1)
    assert code == 0, out
    assert "Node IP: " in out
    ranks = sorted(x for x in out.splitlines() if x.startswith("rank "))
    assert ranks == [f"rank {r}/4 steps 3 in-sync True" for r in range(4)], out


def test_the_site_template_runs_as_a_non_root_owner():
    code, out = _run("site_template.sbatch", 2)
    assert code == 0, out
    assert "(2 nodes, 2 tasks)" in out and "NumNodes=2" in out and "2 R 2" in out
    assert sorted(x for x in out.splitlines() if "in-sync" in x) == [
        f"{r}: rank {r}/2 steps 2 in-sync True" for r in range(2)], out
    assert out.rstrip().endswith("done") or "\ndone\n" in out


@pytest.mark.parametrize("name", ["multinode_torchrun.sbatch", "site_template.sbatch"])
def test_the_corpus_scripts_parse_as_sbatch_scripts(name):
    from trainyard.cli.sbatch import parse_sbatch

    parse_sbatch((HERE / name).read_text(), name)
