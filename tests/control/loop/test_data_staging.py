"""The data step of an attempt's start (control/loop/data_staging.py), on the fake backend and a
fake clock: the job shows CONFIGURING/DataStaging while its nodes stage, the time is its startup,
each node copies once, `node_datasets` follows the caches, and a failed staging ends the attempt as
the user's or the source's fault. The real copies are tests/staging/ and
tests/scenarios/test_datasets_yard_up.py."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

from tests.fake_plane import FakePlane, fake
from tests.plane import TWO_TEAMS
from trainyard.services import datasets
from trainyard.staging.types import (
    CHECKSUM_MISMATCH, DISK_FULL, UNREACHABLE, DatasetRef, DataStagingError, dataset_var,
)
from trainyard.store.models import AttemptRow, JobRow, NodeDatasetRow

CORPUS = DatasetRef("corpus", "v1", "s3://corpora/corpus.jsonl", "sha256:" + "c0" * 32, 1000)
SHARDS = DatasetRef("shards", "v2", "/shared/shards", "sha256:" + "5a" * 32, 3000)


def _plane(tmp_path, more: str = "") -> FakePlane:
    config = tmp_path / "c.yaml"
    config.write_text(TWO_TEAMS.read_text() + more)
    return FakePlane(tmp_path / "plane", config=config)


@pytest.fixture
def plane(tmp_path):
    p = _plane(tmp_path)
    yield p
    p.stop()


def _submit(p: FakePlane, refs=(CORPUS,), **more) -> int:
    """A job whose datasets are pinned as the submit pins them (set on its row before any pass)."""
    body = {"name": "data", "team": "vision", "gpus": 8, "command": fake("run=5"), **more}
    job = p.submit(**body)["id"]
    with p.cp.store.session.begin() as s:
        s.get(JobRow, job).datasets = [datasets.record_of(r) for r in refs]
    return job


def _rows(p: FakePlane) -> set[tuple[str, str]]:
    with p.cp.store.session() as s:
        return {(r.node, r.name) for r in s.scalars(select(NodeDatasetRow))}


def test_the_job_configures_while_its_nodes_stage_and_the_time_is_its_startup(plane):
    p = plane
    gate = threading.Event()
    p.backend.cluster.stage_gate = gate
    job = _submit(p, refs=(CORPUS, SHARDS))
    j = p.wait(job, "CONFIGURING")
    assert j["reason"] == "DataStaging"
    placed = j["start_time"]
    p.run(40)
    assert p.job(job)["state"] == "CONFIGURING"
    gate.set()
    j = p.wait(job, "RUNNING")
    assert j["start_time"] == pytest.approx(placed)  # the staging is the job's time, unlike an image pull
    with p.cp.store.session.begin() as s:  # its first line now (what control/lifecycle/first_output.py records)
        [attempt] = s.scalars(select(AttemptRow).where(AttemptRow.job_id == job)).all()
        assert attempt.started_at == pytest.approx(placed)
        attempt.first_output_at = p.clock()
    for node in ("node-0", "node-1"):  # each rank finds the copy on its own node
        rank = 0 if node == "node-0" else 4
        env = p.backend.rank_env(job, 1, rank)
        assert env[dataset_var("corpus")] == f"/fake-datasets/{node}/{'c0' * 32}"
        assert env["TRAINYARD_DATASET_SHARDS"] == f"/fake-datasets/{node}/{'5a' * 32}"
    j = p.wait(job, "COMPLETED")
    [staged] = [e for e in p.events(job) if e["kind"] == "job.data_staged"]
    nodes = staged["data"]["nodes"]
    assert set(nodes) == {"node-0", "node-1"} and all(v["copied"] for n in nodes.values() for v in n.values())
    assert sorted(p.backend.cluster.stagings) == sorted(
        (n, d) for n in ("node-0", "node-1") for d in ("corpus:v1", "shards:v2"))
    with p.cp.store.session() as s:
        [attempt] = s.scalars(select(AttemptRow).where(AttemptRow.job_id == job)).all()
        ledger = attempt.ledger
    assert ledger["startup"] >= 40 * 8 - 1e-6, ledger  # 40 s of staging, 8 GPUs held: the startup bucket
    assert _rows(p) == {(n, d) for n in ("node-0", "node-1") for d in ("corpus", "shards")}


def test_a_second_job_on_the_same_nodes_stages_nothing(plane):
    p = plane
    first = _submit(p)
    p.wait(first, "COMPLETED")
    second = _submit(p)
    p.wait(second, "COMPLETED")
    assert len(p.backend.cluster.stagings) == 2  # one per node, for the first job only
    [staged] = [e for e in p.events(second) if e["kind"] == "job.data_staged"]
    assert not any(v["copied"] for n in staged["data"]["nodes"].values() for v in n.values())
    assert "0 copied, 2 cached" in staged["message"]


def test_a_node_whose_cache_was_emptied_stages_again_and_its_rows_follow(plane):
    p = plane
    p.wait(_submit(p), "COMPLETED")
    assert p.backend.remove_dataset("node-1", CORPUS.checksum)
    job = _submit(p)
    p.wait(job, "COMPLETED")
    assert sorted(p.backend.cluster.stagings) == [("node-0", "corpus:v1"), ("node-1", "corpus:v1"),
                                                  ("node-1", "corpus:v1")]
    assert _rows(p) == {("node-0", "corpus"), ("node-1", "corpus")}


def test_a_checksum_mismatch_fails_the_job_with_a_cause_of_its_own(plane):
    p = plane
    p.backend.cluster.stage_errors["corpus:v1"] = DataStagingError(CHECKSUM_MISMATCH, "corpus:v1", "the copy hashes "
                                                                   "to sha256:00…, not the pinned one")
    job = _submit(p)
    j = p.wait(job, "FAILED")
    assert j["reason"].startswith("DataStagingError: corpus:v1: the copy hashes"), j["reason"]
    with p.cp.store.session() as s:
        [a] = s.scalars(select(AttemptRow).where(AttemptRow.job_id == job)).all()
        assert (a.state, a.cause) == ("FAILED", "data_staging")


def test_an_unreachable_source_requeues_it_not_counted_against_its_retries(plane):
    p = plane
    p.backend.cluster.stage_errors["corpus:v1"] = DataStagingError(UNREACHABLE, "corpus:v1", "connection refused")
    job = _submit(p)
    j = p.wait(job, "REQUEUED")
    assert j["reason"] == "DataStagingError"
    del p.backend.cluster.stage_errors["corpus:v1"]
    j = p.wait(job, "COMPLETED", timeout=300)
    assert len(j["attempts"]) == 2
    requeued = [e for e in p.events(job) if e["kind"] == "job.requeued"]
    assert requeued and "not counted against its retries" in requeued[0]["message"]


def test_a_full_disk_on_one_node_held_after_five_in_a_row(plane):
    p = plane
    p.backend.cluster.stage_errors["node-1"] = DataStagingError(DISK_FULL, "corpus:v1", "no space left")
    job = _submit(p)
    j = p.wait(job, "FAILED", timeout=3000)
    assert len(j["attempts"]) == 5 and "on node-1" in j["reason"]


def test_an_entry_the_node_evicted_loses_its_row(tmp_path):
    p = _plane(tmp_path, "storage:\n  dataset_cache: {max_gb: 0.000002}\n")  # 2147 bytes: one dataset fits
    try:
        p.wait(_submit(p, refs=(CORPUS,)), "COMPLETED")
        assert _rows(p) == {("node-0", "corpus"), ("node-1", "corpus")}
        other = DatasetRef("other", "v1", "/shared/other", "sha256:" + "0e" * 32, 1500)
        p.wait(_submit(p, refs=(other,)), "COMPLETED")
        assert _rows(p) == {("node-0", "other"), ("node-1", "other")}
    finally:
        p.stop()


def test_a_job_lands_on_the_node_that_holds_its_data_among_equal_nodes(plane):
    p = plane
    blocker = p.submit(name="blocker", team="nlp", gpus=4, command=fake("run=20"))["id"]
    p.wait(blocker, "RUNNING")
    assert [x["node"] for x in p.job(blocker)["placement"]] == ["node-0"]
    first = _submit(p, gpus=4)  # node-0 is taken: it stages on node-1
    j = p.wait(first, "COMPLETED")
    assert [x["node"] for x in j["placement"]] == ["node-1"]
    p.wait(blocker, "COMPLETED")
    plain = p.submit(name="plain", team="vision", gpus=4, command=fake("run=5"))["id"]
    j = p.wait(plain, "COMPLETED")
    assert [x["node"] for x in j["placement"]] == ["node-0"]  # both free: the first node, without data
    second = _submit(p, gpus=4)
    j = p.wait(second, "COMPLETED")
    assert [x["node"] for x in j["placement"]] == ["node-1"]  # both free: the node holding its data
    assert p.backend.cluster.stagings == [("node-1", "corpus:v1")]


def test_an_image_is_pulled_first_then_the_data_staged_in_the_jobs_time(plane):
    p = plane
    digest = "sha256:" + "5e" * 32
    pull, stage = threading.Event(), threading.Event()
    p.backend.cluster.pull_gate, p.backend.cluster.stage_gate = pull, stage
    job = _submit(p, container={"image": f"127.0.0.1:5000/vision/env@{digest}"})
    j = p.wait(job, "CONFIGURING")
    assert j["reason"] == "ImagePull"
    p.run(20)
    pulled = p.clock()
    pull.set()
    j = p.wait(job, lambda j: j["reason"] == "DataStaging")
    assert j["state"] == "CONFIGURING" and j["start_time"] >= pulled - 1e-6  # the pull was not the job's time
    started = j["start_time"]
    p.run(20)
    stage.set()
    j = p.wait(job, "RUNNING")
    assert j["start_time"] == pytest.approx(started)  # the staging was
    p.wait(job, "COMPLETED")


def test_a_job_cancelled_while_its_nodes_stage_ends_cancelled(plane):
    """As with an image pull: the launch goes on (the reconcile step would take an attempt the
    backend never saw for an interrupted launch and requeue it), and the stop sequence, which held
    its signals while the attempt was in flight, ends it at once."""
    p = plane
    gate = threading.Event()
    p.backend.cluster.stage_gate = gate
    job = _submit(p)
    p.wait(job, "CONFIGURING")
    assert p.admin.post(f"/api/v1/jobs/{job}/cancel").status_code == 200
    p.run(5)
    gate.set()
    j = p.wait(job, "CANCELLED", timeout=60)
    p.run(10)
    assert p.job(job)["state"] == "CANCELLED" and len(j["attempts"]) == 1


def test_a_failed_staging_leaves_no_pin_on_the_nodes_that_did_stage(plane):
    p = plane
    p.backend.cluster.stage_errors["node-1"] = DataStagingError(CHECKSUM_MISMATCH, "corpus:v1", "hashes otherwise")
    job = _submit(p)
    p.wait(job, "FAILED")
    assert [e.in_use for e in p.backend.dataset_entries("node-0")] == [False]
    assert p.backend.remove_dataset("node-0", CORPUS.checksum)
