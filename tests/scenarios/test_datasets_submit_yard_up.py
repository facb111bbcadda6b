"""The whole way of a dataset on one real `yard up` (local backend, two emulated nodes), as a user
takes it: `yard submit --dataset corpus:v1` pins it (the catalogue, `cli/dataset_opts.py`,
`services/datasets.py`), the plane stages it on both nodes before the ranks start
(`control/loop/data_staging.py`), every rank reads it at `$TRAINYARD_DATASET_CORPUS` on its own node,
the goodput ledger counts the staging in the attempt's `startup`, `yard dataset stage` then finds it
cached and `yard dataset ls --node all` shows where it is."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.plane import TWO_TEAMS
from tests.yard_cluster import YardCluster

pytest.importorskip("trainyard.staging.source")  # the catalogue's copier
pytest.importorskip("trainyard.cli.dataset_opts")  # and its `--dataset`
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("datasets-submit-yard-up")]

READ = ("import os\np = os.environ['TRAINYARD_DATASET_CORPUS']\n"
        "print('DATA', os.environ['TRAINYARD_NODE'], p, sum(1 for _ in open(p)), flush=True)\n")


@pytest.fixture(scope="module")
def c(tmp_path_factory) -> Iterator[YardCluster]:
    work = tmp_path_factory.mktemp("submitdata")
    corpus = work / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(300)))
    checksum = "sha256:" + hashlib.sha256(corpus.read_bytes()).hexdigest()
    config = work / "c.yaml"
    config.write_text(TWO_TEAMS.read_text() + f"""
datasets:
  - {{name: corpus, version: v1, source: "{corpus}", team: vision, checksum: "{checksum}"}}
""")
    yc = YardCluster(work, "local", config_file=config)
    try:
        yield yc
    finally:
        yc.stop()


def test_submit_with_a_dataset_stages_it_then_it_is_cached(c):
    script = Path(c.data_dir.parent / "read.py")
    script.write_text(READ)
    job = c.submit("-G", "8", "-A", "vision", "--dataset", "corpus:v1", "--", sys.executable, str(script))
    c.wait(job, "COMPLETED", timeout=120)
    logs = c.job_dir(job) / "logs"
    lines = sorted(line.split()[1:] for f in logs.glob("rank-*.log") for line in f.read_text().splitlines()
                   if line.startswith("DATA "))
    assert len(lines) == 8 and {ln[0] for ln in lines} == {"node-0", "node-1"}
    assert all(ln[1].startswith(str(c.data_dir / "datasets" / ln[0])) and ln[2] == "300" for ln in lines)
    events = c.http.get("/api/v1/events", params={"job": job, "limit": 1000}).json()["events"]
    [staged] = [e for e in events if e["kind"] == "job.data_staged"]
    assert all(v["corpus:v1"]["copied"] for v in staged["data"]["nodes"].values())
    ledger: dict[str, Any] = c.http.get(f"/api/v1/jobs/{job}/goodput").json()
    print(f"FIGURE staged in {staged['data']['seconds']:.3f}s; startup {ledger['buckets']['startup']:.3f} GPU-s")
    assert ledger["buckets"]["startup"] >= 8 * staged["data"]["seconds"]  # the staging is the job's startup
    out = c.yard("dataset", "stage", "corpus:v1", "--nodes", "node-[0-1]").stdout
    assert out.count("cached") == 2, out
    listed = c.yard("dataset", "ls", "--node", "all", "--json").stdout
    assert sorted(e["node"] for e in json.loads(listed) if e["name"] == "corpus") == ["node-0", "node-1"]
