"""`yard bench scaling` end to end (issue 39): a real `yard up` (local backend, two emulated nodes),
the tiny llama-pretrain recipe at 1 and 2 nodes of 1 GPU, as jobs through the scheduler. Both
runs complete and the table has each row's step time, throughput, efficiency and ledger shares;
`--json` says the same. The figures themselves (what 2 emulated nodes on 2 cores can show) are in
bench/README.md, "Issue 39: scaling on emulated nodes"; the arithmetic in test_bench_scaling.py.
About 30 s a test on this 2-core machine when quiet, 55 s under load 9."""

from __future__ import annotations

import json
import math
import re
from typing import Iterator

import pytest

from tests.recipes.helpers import TINY_PRETRAIN
from tests.yard_cluster import YardCluster
from trainyard.contracts import LEDGER_BUCKETS

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("bench-scaling-yard-up")]
SETS = [x for s in [*TINY_PRETRAIN, "steps=30", "checkpoint_every=10"] for x in ("--set", s)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[YardCluster]:
    c = YardCluster(tmp_path_factory.mktemp("scaling"), "local")
    try:
        yield c
    finally:
        c.stop()


def test_bench_scaling_runs_both_sizes_and_prints_their_figures(cluster):
    r = cluster.yard("bench", "scaling", "llama-pretrain", "-N", "1,2", "--gpus-per-node", "1", "-A", "vision",
                     "--env", "OMP_NUM_THREADS=1", *SETS, "--json", timeout=400)
    runs = json.loads(r.stdout)["runs"]
    assert [x["nodes"] for x in runs] == [1, 2] and [x["gpus"] for x in runs] == [1, 2]
    for x in runs:
        assert x["state"] == "COMPLETED" and x["steps"] == 30, x
        assert x["step_s"] > 0 and x["samples_per_s"] > 0 and x["tokens_per_s"] > 0, x
        assert set(x["share"]) == set(LEDGER_BUCKETS) and math.fsum(x["share"].values()) == pytest.approx(1.0)
        assert x["share"]["compute"] > 0 and x["share"]["startup"] > 0
        placed = {p["node"] for p in cluster.job(x["job_id"])["placement"]}
        assert len(placed) == x["nodes"], placed
    one, two = runs
    # the global batch is the same at both sizes: samples per step are equal, so throughput is 8 / step time
    for x in runs:
        assert x["samples_per_s"] == pytest.approx(8 / x["step_s"], rel=1e-6)
    assert one["speedup"] == 1.0 and one["efficiency"] == 1.0 and one["per_doubling"] is None
    assert two["speedup"] == pytest.approx(two["samples_per_s"] / one["samples_per_s"])
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    assert two["per_doubling"] == pytest.approx(two["speedup"] / 2)


def test_the_table_has_both_rows(cluster):
    r = cluster.yard("bench", "scaling", "llama-pretrain", "-N", "1,2", "--gpus-per-node", "1", "-A", "vision",
                     "--env", "OMP_NUM_THREADS=1", *[x for s in [*TINY_PRETRAIN, "steps=10"] for x in ("--set", s)],
                     timeout=400)
    lines = r.stdout.splitlines()
    assert lines[0].startswith("llama-pretrain: scaling over 1, 2 nodes")
    assert lines[1].split()[:10] == ["nodes", "gpus", "job", "state", "steps", "step", "s", "samples/s", "speedup",
                                     "eff"]
    rows = [ln.split() for ln in lines[2:]]
    assert [(x[0], x[1], x[3], x[4]) for x in rows] == [("1", "1", "COMPLETED", "10"), ("2", "2", "COMPLETED", "10")]
    for x in rows:
        assert all(re.fullmatch(r"\d+\.\d+", v) for v in x[5:8]), x  # step s, samples/s, speedup
        assert len(x) == 10 + len(LEDGER_BUCKETS) and all(re.fullmatch(r"\d+\.\d", v) for v in x[10:]), x
