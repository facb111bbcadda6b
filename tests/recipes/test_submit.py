"""`yard submit --recipe` against a real control plane (store, loop, local backend, emulated GPUs).

The CLI's submit runs in-process with its HTTP client pointed at the plane's app; the job's ranks
are real processes started by the local backend with the contract environment, each running
`python -m trainyard.recipes llama-pretrain --set …`.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trainyard.cli import jobs
from trainyard.cli.client import Client
from trainyard.cli.main import app
from trainyard.runtime import read_metrics
from tests.plane import Plane, job_dir
from tests.recipes.helpers import TINY_PRETRAIN, mean


@pytest.fixture
def plane(tmp_path, monkeypatch):
    p = Plane(tmp_path / "yard")
    client = Client.__new__(Client)  # the CLI's client, speaking to the in-process app
    client.url, client.http = "http://testserver", p.admin
    monkeypatch.setattr(jobs, "Client", lambda: client)
    yield p
    p.stop()


def submit(*args: str) -> dict:
    r = CliRunner().invoke(app, ["submit", *args, "--json"])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow
def test_submit_recipe_trains_on_two_emulated_gpus_and_the_loss_falls(plane, tmp_path):
    sets = [x for s in [*TINY_PRETRAIN, "steps=20", "checkpoint_every=5"] for x in ("--set", s)]
    job = submit("--recipe", "llama-pretrain", "-G", "2", "-A", "vision", "-D", str(tmp_path),
                 "--env", "OMP_NUM_THREADS=1", *sets)
    assert job["name"] == "llama-pretrain" and job["gpus"] == 2
    assert job["command"][1:4] == ["-m", "trainyard.recipes", "llama-pretrain"]
    assert job["command"][4:6] == ["--set", TINY_PRETRAIN[0]]
    done = plane.wait(job["id"], "COMPLETED", timeout=180)
    assert done["exit_code"] == 0
    jd = job_dir(plane.cp.data_dir, job["id"])
    m = read_metrics(jd / "metrics")
    assert sorted(m) == list(range(1, 21))
    assert mean([m[s]["loss"] for s in range(16, 21)]) < mean([m[s]["loss"] for s in range(1, 6)]) - 0.3
    assert (jd / "checkpoints" / "step-20" / "COMMITTED").is_file()
    log = (jd / "logs" / "rank-0.log").read_text()
    assert "ddp on 2 process(es)" in log


def test_submit_recipe_asks_for_the_recipes_gpus_when_given_none(plane, tmp_path):
    job = submit("--recipe", "gemma-pretrain", "-A", "vision", "-D", str(tmp_path), "-H", "--set", "steps=3")
    assert job["gpus"] == 1 and job["name"] == "gemma-pretrain" and job["command"][-2:] == ["--set", "steps=3"]


def test_submit_recipe_makes_the_users_paths_absolute(plane, tmp_path, monkeypatch):
    """The ranks start in the job's workdir (maybe on another node): a relative data.path or reward
    file given at the login node's prompt is sent as the absolute path it names there."""
    (tmp_path / "corpus.jsonl").write_text('{"text": "hello"}\n')
    monkeypatch.chdir(tmp_path)
    job = submit("--recipe", "llama-pretrain", "-A", "vision", "-D", str(tmp_path), "-H",
                 "--set", "data.path=corpus.jsonl")
    assert job["command"][-2:] == ["--set", f"data.path={tmp_path / 'corpus.jsonl'}"]
