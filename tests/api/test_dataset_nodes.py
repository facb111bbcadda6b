"""/api/v1/datasets/stage and /api/v1/datasets/cache (api/routers/dataset_nodes.py,
services/dataset_nodes.py): pre-staging a catalogued dataset without a job, who may, and the nodes'
cache listing `yard dataset ls --node` prints. On the fake plane (its in-memory caches)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from tests.fake_plane import FakePlane, fake
from tests.plane import TWO_TEAMS
from trainyard.services import datasets
from trainyard.staging.types import CHECKSUM_MISMATCH, DataStagingError
from trainyard.store.models import JobRow

SUM = "sha256:" + "ab" * 32
CATALOGUE = f"""
datasets:
  - {{name: corpus, version: v1, source: /shared/corpus.jsonl, team: vision, checksum: "{SUM}"}}
  - {{name: corpus, version: v2, source: /shared/corpus2.jsonl, team: vision, checksum: "sha256:{'cd' * 32}"}}
  - {{name: shared, version: v1, source: /shared/s, team: vision, checksum: "sha256:{'ef' * 32}", grants: [nlp]}}
"""


@pytest.fixture
def plane(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(TWO_TEAMS.read_text() + CATALOGUE)
    p = FakePlane(tmp_path / "plane", config=config)
    yield p
    p.stop()


def test_an_admin_stages_on_the_nodes_then_they_find_it_cached(plane):
    p = plane
    r = p.admin.post("/api/v1/datasets/stage", json={"dataset": "corpus:v1", "nodes": "node-[0-1]"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["dataset"] == "corpus:v1" and out["checksum"] == SUM
    assert [(n["node"], n["ok"], n["copied"]) for n in out["nodes"]] == [("node-0", True, True), ("node-1", True, True)]
    again = p.admin.post("/api/v1/datasets/stage", json={"dataset": "corpus:v1", "nodes": "node-1"}).json()
    assert [(n["node"], n["copied"]) for n in again["nodes"]] == [("node-1", False)]
    entries = p.admin.get("/api/v1/datasets/cache", params={"node": "node-0"}).json()["entries"]
    assert [(e["node"], e["name"], e["version"], e["checksum"], e["in_use"]) for e in entries] == \
        [("node-0", "corpus", "v1", SUM, False)]
    assert set(entries[0]) == {"node", "name", "version", "checksum", "bytes", "last_used", "in_use"}
    every = p.admin.get("/api/v1/datasets/cache", params={"node": "all"}).json()["entries"]
    assert [e["node"] for e in every] == ["node-0", "node-1"]
    listed = p.admin.get("/api/v1/datasets/cache", params={"node": "node-[0-1]"}).json()["entries"]
    assert listed == every
    assert any(e["kind"] == "dataset.staged" for e in p.events())


def test_without_a_version_the_newest_and_without_nodes_every_node(plane):
    out = plane.admin.post("/api/v1/datasets/stage", json={"dataset": "corpus"}).json()
    assert out["dataset"] == "corpus:v2" and [n["node"] for n in out["nodes"]] == ["node-0", "node-1"]


def test_who_may_stage(plane):
    p = plane
    vision, nlp = p.as_user("alice", "member", "vision"), p.as_user("nora", "member", "nlp")
    operator = p.as_user("olga", "operator")
    assert vision.post("/api/v1/datasets/stage", json={"dataset": "corpus:v1", "nodes": "node-0"}).status_code == 200
    r = nlp.post("/api/v1/datasets/stage", json={"dataset": "corpus:v1", "nodes": "node-0"})
    assert r.status_code == 403 and r.json()["field"] == "dataset" and "not granted" in r.text
    assert nlp.post("/api/v1/datasets/stage", json={"dataset": "shared:v1", "nodes": "node-0"}).status_code == 200
    assert operator.post("/api/v1/datasets/stage", json={"dataset": "corpus:v1"}).status_code == 403
    assert operator.get("/api/v1/datasets/cache").status_code == 200  # listing is a node view


@pytest.mark.parametrize("body,status,field", [
    ({"dataset": "nothere"}, 404, "dataset"),
    ({"dataset": "corpus:v9"}, 404, "dataset"),
    ({"dataset": "Bad Name"}, 422, "dataset"),
    ({"dataset": "corpus:v1", "nodes": "node-9"}, 404, "nodes"),
    ({"dataset": "corpus:v1", "nodes": "node-[1"}, 400, "nodes"),
])
def test_bad_input_names_the_field_and_stages_nothing(plane, body, status, field):
    r = plane.admin.post("/api/v1/datasets/stage", json=body)
    assert r.status_code == status and r.json()["field"] == field, r.text
    assert plane.backend.cluster.stagings == []
    assert plane.admin.get("/api/v1/datasets/cache").json()["entries"] == []


def test_the_listing_of_an_unknown_node_is_a_404_naming_it(plane):
    r = plane.admin.get("/api/v1/datasets/cache", params={"node": "node-9"})
    assert r.status_code == 404 and r.json()["field"] == "node"
    r = plane.admin.get("/api/v1/datasets/cache", params={"node": "node-[0"})
    assert r.status_code == 400 and r.json()["field"] == "node"
    assert plane.as_user("vic", "viewer").get("/api/v1/datasets/cache").status_code == 200


def test_a_member_lists_only_what_their_team_may_use(plane):
    p = plane
    for name in ("corpus:v1", "shared:v1"):
        p.admin.post("/api/v1/datasets/stage", json={"dataset": name, "nodes": "node-0"})
    names = lambda c: sorted(e["name"] for e in c.get("/api/v1/datasets/cache").json()["entries"])  # noqa: E731
    assert names(p.admin) == names(p.as_user("olga", "operator")) == ["corpus", "shared"]
    assert names(p.as_user("alice", "member", "vision")) == ["corpus", "shared"]
    assert names(p.as_user("nora", "member", "nlp")) == ["shared"]  # granted; corpus is vision's alone


def test_a_node_that_fails_is_its_own_line(plane):
    p = plane
    p.backend.cluster.stage_errors["node-1"] = DataStagingError(CHECKSUM_MISMATCH, "corpus:v1", "hashes otherwise")
    out = p.admin.post("/api/v1/datasets/stage", json={"dataset": "corpus:v1"}).json()
    assert [(n["node"], n["ok"], n["kind"]) for n in out["nodes"]] == \
        [("node-0", True, None), ("node-1", False, "checksum_mismatch")]
    assert [e["node"] for e in p.admin.get("/api/v1/datasets/cache").json()["entries"]] == ["node-0"]


def test_an_entry_a_running_job_uses_is_in_use(plane):
    p = plane
    p.admin.post("/api/v1/datasets/stage", json={"dataset": "corpus:v1"})
    job = p.submit(name="d", team="vision", gpus=4, command=fake("run=60"))["id"]
    with p.cp.store.session.begin() as s:
        ref = next(e for e in datasets.catalogue(s, p.cp.configs.current(s).spec, "corpus") if e.version == "v1").ref()
        s.get(JobRow, job).datasets = [datasets.record_of(ref)]
    j = p.wait(job, "RUNNING")
    node = j["placement"][0]["node"]
    used = {e["node"]: e["in_use"] for e in p.admin.get("/api/v1/datasets/cache").json()["entries"]}
    assert used == {"node-0": node == "node-0", "node-1": node == "node-1"}
    with p.cp.store.session() as s:
        assert s.scalars(select(JobRow.state).where(JobRow.id == job)).one() == "RUNNING"
