"""`yard bench scaling` (cli/bench_scaling.py): bad input refused before anything is sent, and the
figures computed from a run's job record and ledger."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trainyard.cli.bench_scaling import RunFigures, compare, figures_of, parse_sizes, table

YARD = [sys.executable, "-m", "trainyard.cli.main"]


@pytest.mark.parametrize("args, says", [
    (["-N", "0"], "-N/--nodes: '0'"),
    (["-N", "1,x"], "-N/--nodes: '1,x' is not a list"),
    (["-N", "1,3", "--gpus-per-node", "1"], "-N/--nodes: 3 node(s): batch.global_batch_size"),
    (["-N", "1", "--set", "steps=abc"], "steps:"),
    (["-N", "1", "--run-timeout", "soon"], "--run-timeout"),
])
def test_bad_input_is_exit_2_naming_it_before_anything_is_sent(args: list[str], says: str) -> None:
    env = {**os.environ, "YARD_URL": "http://127.0.0.1:9", "YARD_TOKEN": "x"}  # nothing listens: nothing sent
    r = subprocess.run([*YARD, "bench", "scaling", "llama-pretrain", *args], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr


def test_sizes_are_sorted_once() -> None:
    assert parse_sizes("4,1,2,2") == [1, 2, 4]


def _run(nodes: int, job_id: int, samples: int, steps: int, compute: float, startup: float) -> RunFigures:
    gpus = nodes
    allocated = compute + startup
    job = {"id": job_id, "state": "COMPLETED", "progress": {"step": steps, "metrics": {"samples": samples}}}
    goodput = {"allocated_gpu_s": allocated, "buckets": {"compute": compute, "startup": startup},
               "attempts": [{"attempt": 1, "gpus": gpus}]}
    return figures_of(nodes, job, goodput)


def test_step_time_throughput_and_efficiency_per_doubling() -> None:
    # 1 node: 100 steps in 50 s of compute on 1 GPU; 2 nodes: 100 steps in 30 s wall (60 GPU-s on 2 GPUs)
    one, two = _run(1, 7, 3200, 100, 50.0, 10.0), _run(2, 8, 3200, 100, 60.0, 20.0)
    assert one.step_s == pytest.approx(0.5) and two.step_s == pytest.approx(0.3)
    assert one.samples_per_s == pytest.approx(64.0) and two.samples_per_s == pytest.approx(3200 / 30)
    compare([one, two])
    assert two.speedup == pytest.approx(50 / 30)
    assert two.efficiency == pytest.approx(50 / 30 / 2)
    assert two.per_doubling == pytest.approx(50 / 30 / 2)
    assert one.share["startup"] == pytest.approx(10 / 60) and two.share["compute"] == pytest.approx(0.75)
    out = table("llama-pretrain", [one, two])
    assert "0.83" in out and "75.0" in out  # efficiency and the compute share of the 2-node run


def test_a_run_that_failed_has_no_figures_but_a_row() -> None:
    failed = figures_of(2, {"id": 9, "state": "FAILED", "progress": None}, {"allocated_gpu_s": 0, "buckets": {}})
    compare([failed])
    assert failed.step_s is None and failed.speedup is None
    assert "FAILED" in table("x", [failed])
