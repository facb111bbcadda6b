"""`-e/--error` (stderr apart, Slurm's filename patterns) and `--open-mode` on a real `yard up`
(local backend), for the command form and a batch script; bad values exit 2 naming the option."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.yard_cluster import YardCluster

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("error-open-mode")]

BOTH = [sys.executable, "-c", "import os, sys; print('out', os.environ['RANK'], flush=True); "
        "print('err', os.environ['RANK'], file=sys.stderr, flush=True)"]


@pytest.fixture(scope="module")
def yc(tmp_path_factory):
    os.environ["PLANE_ONLY_MARK"] = "plane"  # in yard up's environment (and the CLI's shell)
    try:
        c = YardCluster(tmp_path_factory.mktemp("errors"), "local")
    finally:
        del os.environ["PLANE_ONLY_MARK"]
    yield c
    c.stop()


def test_error_apart_from_output_with_patterns(yc, tmp_path):
    job = yc.submit("-A", "vision", "-G", "2", "-J", "split", "-D", str(tmp_path), "-o", "out-%x-%j-%t.txt",
                    "-e", "err-%u-%5j-%t.txt", "--", *BOTH)
    j = yc.wait(job, "COMPLETED")
    assert j["error"] == "err-%u-%5j-%t.txt"
    user = j["user"]
    for r in (0, 1):
        out = (tmp_path / f"out-split-{job}-{r}.txt").read_text()
        err = (tmp_path / f"err-{user}-{job:05d}-{r}.txt").read_text()
        assert f"out {r}" in out and "err" not in out.split("===")[-1]
        assert f"err {r}" in err and f"out {r}" not in err
    # -e is --error on the command line (as in sbatch); --env stays, long form only
    job = yc.submit("-A", "vision", "-D", str(tmp_path), "--env", "K=V", "-e", "e.txt", "--",
                    sys.executable, "-c", "import os, sys; print(os.environ['K'], file=sys.stderr)")
    yc.wait(job, "COMPLETED")
    assert "V" in (tmp_path / "e.txt").read_text()


def test_sbatch_error_line_takes_the_scripts_and_its_tasks_stderr(yc, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -N 2 --gpus-per-node=1\n#SBATCH -o o-%j.txt\n#SBATCH -e e-%j.txt\n"
                      "echo script-out; echo script-err >&2\n"
                      f"srun {sys.executable} -c \"import os, sys; print('task-out', os.environ['SLURM_PROCID']); "
                      "print('task-err', os.environ['SLURM_PROCID'], file=sys.stderr)\"\n")
    job = yc.submit("-A", "vision", "-D", str(tmp_path), str(script))
    yc.wait(job, "COMPLETED")
    out, err = (tmp_path / f"o-{job}.txt").read_text(), (tmp_path / f"e-{job}.txt").read_text()
    assert "script-out" in out and "task-out 0" in out and "task-out 1" in out and "err" not in out.replace("===", "")
    assert "script-err" in err and "task-err 0" in err and "task-err 1" in err and "-out" not in err


@pytest.mark.parametrize("mode, attempts", [(None, [1, 2]), ("append", [1, 2]), ("truncate", [2])])
def test_open_mode_across_attempts(yc, tmp_path, mode, attempts):
    opts = [f"--open-mode={mode}"] if mode else []
    job = yc.submit("-A", "vision", "-D", str(tmp_path), "-o", "log-%j.txt", "-e", "err-%j.txt", *opts, "--", *BOTH)
    yc.wait(job, "COMPLETED")
    yc.yard("requeue", str(job))
    yc.wait(job, lambda j: j["state"] == "COMPLETED" and j["attempt"] == 2)
    for name in (f"log-{job}.txt", f"err-{job}.txt"):
        text = (tmp_path / name).read_text()
        assert [a for a in (1, 2) if f"attempt {a} started" in text] == attempts, text
    assert yc.yard("logs", str(job)).stdout.count("out 0") == len(attempts)


def test_bad_error_and_open_mode_exit_2_naming_them(yc, tmp_path):
    before = len(yc.http.get("/api/v1/jobs", params={"state": "all"}).json()["jobs"])
    r = yc.yard("submit", "-A", "vision", "-e", "err-%q.txt", "--", "true", check=False)
    assert r.returncode == 2 and "--error: unknown filename pattern '%q'" in r.stderr
    r = yc.yard("submit", "-A", "vision", "--open-mode=sometimes", "--", "true", check=False)
    assert r.returncode == 2 and "--open-mode: expected append or truncate" in r.stderr
    script = tmp_path / "bad.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --open-mode=keep\ntrue\n")
    r = yc.yard("submit", "-A", "vision", str(script), check=False)
    assert r.returncode == 2 and f"{script}:2: --open-mode" in r.stderr
    r = yc.yard("submit", "-A", "vision", "-e", str(script), "--", "true", check=False)  # a file, not a link
    assert r.returncode == 2 and f"--error {script}: {script} exists and is not a link" in r.stderr
    api = yc.http.post("/api/v1/jobs", json={"command": ["true"], "team": "vision", "open_mode": "sideways"})
    assert 400 <= api.status_code < 500 and "open_mode" in api.text
    assert len(yc.http.get("/api/v1/jobs", params={"state": "all"}).json()["jobs"]) == before


@pytest.mark.parametrize("export", ["NONE", "MINE"])
def test_export_none_gives_a_clean_environment(yc, tmp_path, export):
    """Slurm's --export=NONE (and a list without ALL): nothing of the shell, nothing of the plane's
    own environment; the job's SLURM_*, HOME/USER and a default PATH."""
    dump = [sys.executable, "-c", "import json, os; print('ENV', json.dumps(dict(os.environ)), flush=True)"]
    env = {**yc.env(), "MINE": "mine", "PLANE_ONLY_MARK": "shell"}
    import subprocess
    from tests.plane import YARD
    r = subprocess.run([YARD, "submit", "-A", "vision", "-D", str(tmp_path), f"--export={export}", "--", *dump],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.split("Submitted job")[1].split()[0])
    yc.wait(job, "COMPLETED")
    seen = json.loads(yc.yard("logs", str(job)).stdout.split("ENV ", 1)[1].splitlines()[0])
    assert "PLANE_ONLY_MARK" not in seen and "VIRTUAL_ENV" not in seen
    assert seen["SLURM_EXPORT_ENV"] == export and seen["SLURM_JOB_ID"] == str(job)
    assert seen["HOME"] and seen["USER"] and seen["PATH"].startswith("/usr/local/sbin")
    assert (seen.get("MINE") == "mine") == (export == "MINE")
    # the default (ALL) still carries the shell
    job = yc.submit("-A", "vision", "-D", str(tmp_path), "--", *dump)
    yc.wait(job, "COMPLETED")
    seen = json.loads(yc.yard("logs", str(job)).stdout.split("ENV ", 1)[1].splitlines()[0])
    assert seen["PLANE_ONLY_MARK"] == "plane" and "SLURM_EXPORT_ENV" not in seen
