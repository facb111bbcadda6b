"""The Slurm backend's datasets without a cluster: the plane writes each node's staged copies beside
the job's environment (`slurm/env.py`: job-datasets.json) and each task takes its own node's
(`slurm/task.py` `read_job_env`, by SLURMD_NODENAME). The staging itself is staging/cache.py's
under `<data_dir>/datasets/<node>` (this machine's nodes), tested there."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from trainyard.backends.slurm import env as slurm_env
from trainyard.backends.slurm.task import read_job_env

from tests.backends.helpers import make_spec

PATHS = {"n1": {"TRAINYARD_DATASET_CORPUS": "/data/datasets/n1/ab/data"},
         "n2": {"TRAINYARD_DATASET_CORPUS": "/data/datasets/n2/ab/data"}}


def test_each_task_gets_its_own_nodes_copy(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    spec = replace(make_spec(tmp_path, 5, ["/bin/true"]), dataset_paths=PATHS)
    slurm_env.write_job_env(run, spec)
    assert json.loads((run / slurm_env.JOB_DATASETS_FILE).read_text()) == PATHS
    for node in ("n1", "n2"):
        monkeypatch.setenv("SLURMD_NODENAME", node)
        env = read_job_env(str(run))
        assert env["TRAINYARD_DATASET_CORPUS"] == PATHS[node]["TRAINYARD_DATASET_CORPUS"]
        assert env["TRAINYARD_JOB_ID"] == "5"


def test_a_job_without_datasets_writes_no_file(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    slurm_env.write_job_env(run, make_spec(tmp_path, 6, ["/bin/true"]))
    assert not (run / slurm_env.JOB_DATASETS_FILE).exists()
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    assert not any(k.startswith("TRAINYARD_DATASET_") for k in read_job_env(str(run)))


def test_a_broken_file_is_an_error_naming_it(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    slurm_env.write_job_env(run, make_spec(tmp_path, 7, ["/bin/true"]))
    (run / slurm_env.JOB_DATASETS_FILE).write_text("[not json")
    with pytest.raises(ValueError, match="datasets"):
        read_job_env(str(run))
