"""`--export` (issue 17, item 4): the submitting shell's environment goes with the job, as sbatch's
default `--export=ALL`, so a script calling `torchrun` from a virtualenv finds it; NONE and lists as
Slurm has them, on the command line and in `#SBATCH`. Real `yard` processes against a real `yard up`
on the local backend; each job really runs and prints what it saw."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.cli.yard_process import job_id_of, stored, yard_process

PROBE = ('echo "MY_VAR=${MY_VAR:-unset} OTHER=${OTHER:-unset} TOKEN=${YARD_TOKEN:-unset} '
         'JOB=$TRAINYARD_JOB_ID"; fake-torchrun')


# One worker for this module's tests under `make test`'s --dist loadgroup: its module-scoped
# yard up starts once, not once per worker (about 4 s of CPU each).
pytestmark = pytest.mark.xdist_group("cli-export")


@pytest.fixture(scope="module")
def yard(tmp_path_factory):
    yield from yard_process(tmp_path_factory, "export")


@pytest.fixture
def venv(tmp_path) -> Path:
    """A virtualenv's bin dir holding a `fake-torchrun` that says where it ran from."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    tool = bin_dir / "fake-torchrun"
    tool.write_text("#!/bin/sh\necho torchrun-from-venv\n")
    tool.chmod(0o755)
    return bin_dir


def shell(venv: Path, **more: str) -> dict[str, str]:
    """A submitting shell with the venv activated, MY_VAR set, and a TRAINYARD_JOB_ID the plane must override."""
    return {"PATH": f"{venv}:{os.environ['PATH']}", "VIRTUAL_ENV": str(venv.parent), "MY_VAR": "hello",
            "TRAINYARD_JOB_ID": "999", **more}


def finished(yard, jid: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        j = json.loads(yard("show", str(jid), "--json").stdout)
        if j["state"] in ("COMPLETED", "FAILED", "CANCELLED"):
            return j
        assert time.monotonic() < deadline, j
        time.sleep(0.2)


def run_job(yard, venv: Path, *args: str, cwd: Path | None = None) -> tuple[dict, str]:
    jid = job_id_of(yard("submit", "-A", "nlp", *args, env_extra=shell(venv), cwd=cwd))
    j = finished(yard, jid)
    return j, yard("logs", str(jid)).stdout


def test_the_shell_environment_goes_with_the_job_by_default(yard, venv):
    j, log = run_job(yard, venv, "--", "sh", "-c", PROBE)
    assert j["state"] == "COMPLETED", (j, log)
    assert "torchrun-from-venv" in log and "MY_VAR=hello" in log, log
    # the CLI's token is never sent, and the plane's own variables win over the shell's
    assert "TOKEN=unset" in log and f"JOB={j['id']}" in log, log
    assert j["env"]["VIRTUAL_ENV"] == str(venv.parent)
    assert not [k for k in j["env"] if k.startswith(("YARD_", "TRAINYARD_", "SLURM_")) or k in ("PWD", "SHLVL")]


def test_export_none_sends_nothing_of_the_shell(yard, venv):
    j, log = run_job(yard, venv, "--export=NONE", "--", "sh", "-c", PROBE)
    assert j["state"] == "FAILED", (j, log)  # fake-torchrun is not on the PATH the job has
    assert "MY_VAR=unset" in log and f"JOB={j['id']}" in log, log
    assert j["env"] == {"SLURM_EXPORT_ENV": "NONE"}  # as sbatch sets it: the backend starts from a minimal env


def test_an_export_list_sends_only_those_and_the_values_given(yard, venv):
    j, log = run_job(yard, venv, "--export", "MY_VAR,OTHER=x,ABSENT_ONE", "--", "sh", "-c", PROBE)
    assert "MY_VAR=hello OTHER=x" in log, log
    assert j["env"] == {"MY_VAR": "hello", "OTHER": "x", "SLURM_EXPORT_ENV": "MY_VAR,OTHER=x,ABSENT_ONE"}


def test_export_all_with_values_and_none_in_sbatch_lines(yard, venv, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --export=ALL,OTHER=from-script\n{PROBE}\n")
    j, log = run_job(yard, venv, str(script), cwd=tmp_path)
    assert j["state"] == "COMPLETED" and "MY_VAR=hello OTHER=from-script" in log and "torchrun-from-venv" in log, log
    script.write_text(f"#!/bin/bash\n#SBATCH --export=NONE\n{PROBE}\n")
    j, log = run_job(yard, venv, str(script), cwd=tmp_path)
    assert "MY_VAR=unset" in log and j["env"] == {"SLURM_EXPORT_ENV": "NONE"}, log
    j, log = run_job(yard, venv, "--export=OTHER=cli", str(script), cwd=tmp_path)  # the command line wins
    assert "MY_VAR=unset OTHER=cli" in log, log


@pytest.mark.parametrize("value", ["NONE,MY_VAR", "1BAD", "ALL,,X", ""])
def test_a_malformed_export_is_exit_2_naming_it_and_nothing_stored(yard, venv, tmp_path, value):
    before = stored(yard)
    p = yard("submit", "-A", "nlp", f"--export={value}", "--", "true", ok=False, env_extra=shell(venv))
    assert p.returncode == 2 and p.stderr.startswith("error: --export: "), p.stderr
    script = tmp_path / "bad.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --export={value}\ntrue\n")
    p = yard("submit", "-A", "nlp", str(script), ok=False, cwd=tmp_path)
    assert p.returncode == 2 and f"{script}:2: --export: " in p.stderr, p.stderr
    assert stored(yard) == before
