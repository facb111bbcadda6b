"""Issue 41's staging acceptance on one real `yard up` (local backend, two emulated 4-GPU nodes,
real rank processes, the real node caches of staging/cache.py under `<data_dir>/datasets/<node>`):

- a 2-node job with the catalogue's `corpus:v1` (a jsonl file on a "shared" path) shows
  CONFIGURING/DataStaging, each node copies it once, and every rank reads it at
  `$TRAINYARD_DATASET_CORPUS` on its own node (a read-only copy: the rank cannot write it);
- a second job on the same nodes copies nothing (the event's figures: per node, cached);
- a node whose cache was emptied copies again; the others find theirs;
- a dataset whose source no longer hashes to its pinned checksum fails the job with
  `DataStagingError`, and no node's cache holds anything of it, whole or half;
- `yard dataset stage NAME --nodes …` (`cli/dataset_stage.stage`) pre-stages, and
  `GET /api/v1/datasets/cache` lists what each node holds.

The job's datasets are pinned on its row while it is held (what the catalogue's `--dataset` does
at submit), then it is released. About 40 s on this 2-core machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import typer
from typer.testing import CliRunner

import httpx

from tests.accounts import ROOT_ONLY, accounts, shared_dir
from tests.yard_cluster import YardCluster
from trainyard.cli.dataset_stage import stage
from trainyard.staging.cache import NodeDatasetCache

pytest.importorskip("trainyard.staging.source")  # the catalogue's copier (staging/source.py)
pytestmark = [pytest.mark.slow, ROOT_ONLY, pytest.mark.xdist_group("datasets-yard-up")]
PYTHON = "/usr/bin/python3"  # the reader is standard library only: an interpreter the owner may run

READ = ("import os, sys\n"
        "p = os.environ['TRAINYARD_DATASET_CORPUS']\n"
        "n = sum(1 for _ in open(p))\n"
        "try:\n    open(p, 'a').write('x'); w = 'writable'\nexcept OSError:\n    w = 'read-only'\n"
        "print('DATA', os.environ.get('TRAINYARD_NODE'), p, n, w, os.getuid(), flush=True)\n")


def _sum(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


CONFIG = """\
cluster:
  name: data
  nodes:
    - {{name: node, count: 2, gpus: 4, gpu_model: emulated, gpu_mem_gb: 16, block: b0, rack: r0}}
teams:
  - {{name: vision, cohort: lab, group: {group}, quotas: {{default: {{nominal: 8, borrowing_limit: 8}}}}}}
classes:
  - {{name: training, priority: 200, preemptible: true, max_wait: 24h, grace_period: 2}}
default_class: training
users: {{{user}: {account}}}
datasets:
  - {{name: corpus, version: v1, source: "{corpus}", team: vision, checksum: "{corpus_sum}"}}
  - {{name: other, version: v1, source: "{other}", team: vision, checksum: "{other_sum}"}}
  - {{name: changed, version: v1, source: "{changed}", team: vision, checksum: "{changed_sum}"}}
"""
TOKEN_USER = "carl"


@pytest.fixture(scope="module")
def world() -> Iterator[dict[str, Any]]:
    with accounts({"owner": ["team"]}, ["team"]) as acc, shared_dir("tydata") as work:
        shared = work / "shared"
        shared.mkdir(mode=0o755)
        corpus = shared / "corpus.jsonl"
        corpus.write_text("".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(1000)))
        other = shared / "other.jsonl"
        other.write_text('{"text": "other"}\n' * 10)
        changed = shared / "changed.jsonl"
        changed.write_text('{"text": "as added"}\n')
        pinned = _sum(changed)
        changed.write_text('{"text": "changed since"}\n')
        home = work / "home"  # the owner's working directory
        home.mkdir(mode=0o700)
        os.chown(home, acc.uid("owner"), acc.gid("team"))
        config = work / "c.yaml"
        config.write_text(CONFIG.format(group=acc.group("team"), user=TOKEN_USER, account=acc.user("owner"),
                                        corpus=corpus, corpus_sum=_sum(corpus), other=other, other_sum=_sum(other),
                                        changed=changed, changed_sum=pinned))
        c = YardCluster(work / "cluster", "local", config_file=config)
        try:
            r = c.http.post("/api/v1/tokens", json={"user": TOKEN_USER, "role": "member", "team": "vision"})
            assert r.status_code == 201, r.text
            member = httpx.Client(base_url=c.server.url, headers={"Authorization": f"Bearer {r.json()['token']}"},
                                  timeout=10)
            yield {"c": c, "corpus": corpus, "home": home, "member": member, "uid": acc.uid("owner"),
                   "sums": {"corpus": _sum(corpus), "other": _sum(other), "changed": pinned}}
        finally:
            c.stop()


def _run(w: dict[str, Any], name: str) -> int:
    """A held 2-node job of the member reading `name`, its dataset pinned on its row, then released."""
    c: YardCluster = w["c"]
    r = w["member"].post("/api/v1/jobs", json={
        "name": "reader", "team": "vision", "gpus": 8, "hold": True, "workdir": str(w["home"]),
        "command": [PYTHON, "-c", READ.replace("CORPUS", name.upper())]})
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    source = str(w["corpus"].parent / f"{name}.jsonl")
    pinned = [{"name": name, "version": "v1", "source": source, "checksum": w["sums"][name], "bytes": 0,
               "reader": None}]
    with sqlite3.connect(c.data_dir / "trainyard.db") as db:
        db.execute("UPDATE jobs SET datasets = ? WHERE id = ?", (json.dumps(pinned), job))
    assert c.http.post(f"/api/v1/jobs/{job}/release").status_code == 200
    return job


def _staged(c: YardCluster, job: int) -> dict[str, Any]:
    events = c.http.get("/api/v1/events", params={"job": job, "limit": 1000}).json()["events"]
    [e] = [e for e in events if e["kind"] == "job.data_staged"]
    return e


def _lines(c: YardCluster, job: int) -> list[list[str]]:
    logs = c.job_dir(job) / "logs"
    return sorted(line.split()[1:] for f in logs.glob("rank-*.log") for line in f.read_text().splitlines()
                  if line.startswith("DATA "))


def test_staged_once_per_node_then_cached_then_again_where_emptied(world):
    c: YardCluster = world["c"]
    first = _run(world, "corpus")
    seen = c.wait(first, lambda j: j["state"] in ("CONFIGURING", "RUNNING", "COMPLETED"), timeout=60)
    j = c.wait(first, "COMPLETED", timeout=120)
    ev = _staged(c, first)
    assert {n: v["corpus:v1"]["copied"] for n, v in ev["data"]["nodes"].items()} == {"node-0": True, "node-1": True}
    lines = _lines(c, first)
    assert len(lines) == 8  # every rank read the whole file on its own node, and could not write it
    for node, path, n, writable, uid in lines:
        assert path == str(NodeDatasetCache(c.data_dir / "datasets" / node).path_of(world["sums"]["corpus"])) and n == "1000" and writable == "read-only"
        assert uid == str(world["uid"])  # the owner's rank, not root's
    assert {ln[0] for ln in lines} == {"node-0", "node-1"}
    print(f"FIGURE first staging: {ev['data']['seconds']:.3f}s; per node "
          f"{ {n: v['corpus:v1']['seconds'] for n, v in ev['data']['nodes'].items()} }; state seen {seen['state']}")

    second = _run(world, "corpus")
    c.wait(second, "COMPLETED", timeout=120)
    ev = _staged(c, second)
    assert not any(v["corpus:v1"]["copied"] for v in ev["data"]["nodes"].values())
    print(f"FIGURE cached start: {ev['data']['seconds']:.3f}s")

    gone = NodeDatasetCache(c.data_dir / "datasets" / "node-1").path_of(world["sums"]["corpus"]).parent  # emptied by hand
    for top, dirs, _ in os.walk(gone):
        os.chmod(top, 0o755)
    import shutil
    shutil.rmtree(gone)
    third = _run(world, "corpus")
    c.wait(third, "COMPLETED", timeout=120)
    ev = _staged(c, third)
    assert {n: v["corpus:v1"]["copied"] for n, v in ev["data"]["nodes"].items()} == {"node-0": False, "node-1": True}
    with sqlite3.connect(c.data_dir / "trainyard.db") as db:
        rows = db.execute("SELECT node, name FROM node_datasets ORDER BY node").fetchall()
    assert rows == [("node-0", "corpus"), ("node-1", "corpus")]
    assert j["start_time"] is not None


def test_a_source_that_changed_fails_the_job_and_leaves_nothing(world):
    c: YardCluster = world["c"]
    job = _run(world, "changed")
    j = c.wait(job, "FAILED", timeout=120)
    assert j["reason"].startswith("DataStagingError: changed:v1:"), j["reason"]
    for node in ("node-0", "node-1"):
        root = c.data_dir / "datasets" / node
        assert not NodeDatasetCache(root).has(world["sums"]["changed"])
        assert not [n for n in os.listdir(root) if n.startswith((".tmp.", ".gone."))]


def test_pre_staging_from_the_command_then_the_listing(world):
    c: YardCluster = world["c"]
    app = typer.Typer()
    app.command("stage")(stage)
    app.command("noop")(lambda: None)  # a group: `stage` stays a sub-command, as under `yard dataset`
    env = {"YARD_URL": c.server.url, "YARD_TOKEN": c.server.token}
    r = CliRunner().invoke(app, ["stage", "other:v1", "--nodes", "node-[0-1]"], env=env)
    assert r.exit_code == 0, r.output
    assert "other:v1" in r.output and r.output.count("copied") == 2
    r = CliRunner().invoke(app, ["stage", "other", "--nodes", "node-0"], env=env)
    assert r.exit_code == 0 and "cached" in r.output, r.output
    r = CliRunner().invoke(app, ["stage", "Not A Name"], env=env)
    assert r.exit_code == 2
    entries = c.http.get("/api/v1/datasets/cache", params={"node": "all"}).json()["entries"]
    assert {(e["node"], e["name"]) for e in entries} >= {("node-0", "other"), ("node-1", "other")}
    assert all(e["bytes"] > 0 and e["last_used"] <= time.time() + 1 for e in entries)
