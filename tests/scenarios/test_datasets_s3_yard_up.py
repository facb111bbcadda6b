"""Issue 41's staging acceptance with the source in an object store: a real `yard up` (local backend,
two emulated nodes) reads `corpus:v1`, a jsonl object in a real SeaweedFS S3 server on loopback
(tests/staging/seaweed.py), through the configuration's `storage.object_stores` entry and its
credentials file; both nodes copy it once and every rank reads its own node's copy; a second job
copies nothing; with the server down, a node that must copy requeues the job as the source's fault
(not counted against its retries), and the job completes once the server is back.

The job's datasets are pinned on its row while it is held (what `--dataset` does at submit), then it
is released. About 40 s here (the server's start is most of it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import sys
from typing import Any, Iterator

import pytest

from tests.plane import TWO_TEAMS
from tests.yard_cluster import YardCluster
from trainyard.staging.cache import NodeDatasetCache

pytest.importorskip("trainyard.staging.source")  # the catalogue's copier (staging/source.py)
seaweed_module = pytest.importorskip("tests.staging.seaweed")  # the catalogue's S3 server fixture
seaweed = seaweed_module.seaweed
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("datasets-s3-yard-up")]

READ = ("import os\np = os.environ['TRAINYARD_DATASET_CORPUS']\n"
        "print('DATA', os.environ['TRAINYARD_NODE'], sum(1 for _ in open(p)), flush=True)\n")
CORPUS = "".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(500)).encode()


@pytest.fixture(scope="module")
def world(seaweed, tmp_path_factory) -> Iterator[dict[str, Any]]:  # noqa: F811
    work = tmp_path_factory.mktemp("s3data")
    url = seaweed.put("corpora/corpus.jsonl", CORPUS)
    creds = work / "s3.cred"
    creds.write_text(f"{seaweed.key}\n{seaweed.secret}\n")
    creds.chmod(0o600)
    checksum = "sha256:" + hashlib.sha256(CORPUS).hexdigest()
    config = work / "c.yaml"
    config.write_text(TWO_TEAMS.read_text() + f"""
storage:
  object_stores:
    - {{url: "s3://{seaweed.bucket}", endpoint_url: "{seaweed.endpoint_url}", credentials_file: "{creds}"}}
datasets:
  - {{name: corpus, version: v1, source: "{url}", team: vision, checksum: "{checksum}"}}
""")
    c = YardCluster(work, "local", config_file=config)
    try:
        yield {"c": c, "s3": seaweed, "pinned": [{"name": "corpus", "version": "v1", "source": url,
                                                   "checksum": checksum, "bytes": len(CORPUS), "reader": None}]}
    finally:
        c.stop()


def _run(w: dict[str, Any]) -> int:
    c: YardCluster = w["c"]
    r = c.http.post("/api/v1/jobs", json={"name": "s3reader", "team": "vision", "gpus": 8, "hold": True,
                                          "command": [sys.executable, "-c", READ]})
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    with sqlite3.connect(c.data_dir / "trainyard.db") as db:
        db.execute("UPDATE jobs SET datasets = ? WHERE id = ?", (json.dumps(w["pinned"]), job))
    assert c.http.post(f"/api/v1/jobs/{job}/release").status_code == 200
    return job


def _copied(c: YardCluster, job: int) -> dict[str, bool]:
    events = c.http.get("/api/v1/events", params={"job": job, "limit": 1000}).json()["events"]
    [e] = [e for e in events if e["kind"] == "job.data_staged"]
    print(f"FIGURE s3 job {job}: {e['message']}")
    return {n: v["corpus:v1"]["copied"] for n, v in e["data"]["nodes"].items()}


def _reads(c: YardCluster, job: int) -> list[tuple[str, str]]:
    logs = c.job_dir(job) / "logs"
    return sorted(tuple(line.split()[1:3]) for f in logs.glob("rank-*.log") for line in f.read_text().splitlines()
                  if line.startswith("DATA "))


def test_staged_from_the_object_store_once_per_node(world):
    c: YardCluster = world["c"]
    first = _run(world)
    c.wait(first, "COMPLETED", timeout=120)
    assert _copied(c, first) == {"node-0": True, "node-1": True}
    assert _reads(c, first) == [("node-0", "500")] * 4 + [("node-1", "500")] * 4
    second = _run(world)
    c.wait(second, "COMPLETED", timeout=120)
    assert _copied(c, second) == {"node-0": False, "node-1": False}


def test_an_unreachable_store_requeues_then_the_job_completes(world):
    c: YardCluster = world["c"]
    s3 = world["s3"]
    gone = NodeDatasetCache(c.data_dir / "datasets" / "node-1").path_of(world["pinned"][0]["checksum"]).parent  # copy again
    for top, _, _ in os.walk(gone):
        os.chmod(top, 0o755)
    shutil.rmtree(gone)
    s3.stop()
    try:
        job = _run(world)
        j = c.wait(job, lambda j: j["state"] == "PENDING" and j["reason"] == "DataStagingError"
                   or j["state"] == "REQUEUED", timeout=120)
        assert j["attempts"][0]["state"] == "REQUEUED", j["attempts"]
    finally:
        s3.start()
    with sqlite3.connect(c.data_dir / "trainyard.db") as db:  # not the 30 s pause: back in the queue now
        db.execute("UPDATE jobs SET retry_after = NULL WHERE id = ?", (job,))
    j = c.wait(job, "COMPLETED", timeout=180)
    assert len(j["attempts"]) == 2 and _copied(c, job) == {"node-0": False, "node-1": True}
