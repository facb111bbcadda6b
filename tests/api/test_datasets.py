"""/api/v1/datasets (services/datasets.py): the catalogue of the configuration and of members,
grants between teams, a job's datasets pinned at submit, and bad input refused with a 4xx naming
the field and nothing written. Sources are real: files on disk and a SeaweedFS S3 server."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.plane import TWO_TEAMS, Plane
from tests.staging.seaweed import SeaweedS3, seaweed  # noqa: F401  (fixture)

# One plane and one SeaweedFS for the module, whose tests build on each other in order (v1.1 is added
# before the listing and the pinning look for it; the test that stops SeaweedFS is last): one worker.
pytestmark = pytest.mark.xdist_group("api-datasets")

CONFIGURED = "sha256:" + "ab" * 32


def _config(tmp: Path, sw: SeaweedS3) -> Path:
    cred = tmp / "s3.cred"
    cred.write_text(f"{sw.key}\n{sw.secret}\n")
    cred.chmod(0o600)
    text = TWO_TEAMS.read_text() + f"""
storage:
  object_stores:
    - {{url: "s3://{sw.bucket}", endpoint_url: "{sw.endpoint_url}", credentials_file: "{cred}"}}
datasets:
  - {{name: shared, version: v1, source: "s3://{sw.bucket}/shared.txt", team: vision, checksum: "{CONFIGURED}",
     grants: [nlp]}}
  - {{name: visionly, version: v1, source: "s3://{sw.bucket}/v.txt", team: vision, checksum: "{CONFIGURED}"}}
"""
    path = tmp / "config.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def p(tmp_path_factory, seaweed: SeaweedS3):  # noqa: F811
    tmp = tmp_path_factory.mktemp("datasets-api")
    plane = Plane(tmp / "data", config=_config(tmp, seaweed), start=False)
    yield plane
    plane.stop()


@pytest.fixture(scope="module")
def corpus(seaweed: SeaweedS3) -> dict[str, str]:  # noqa: F811
    data = b'{"text": "hello"}\n' * 100
    return {"url": seaweed.put("corpus/train.jsonl", data), "checksum": "sha256:" + hashlib.sha256(data).hexdigest(),
            "bytes": str(len(data))}


def _count(p: Plane, table: str) -> int:
    with p.cp.store.session() as s:
        from sqlalchemy import text

        return int(s.execute(text(f"SELECT count(*) FROM {table}")).scalar() or 0)


def test_a_member_adds_a_version_the_plane_probes_and_hashes(p: Plane, corpus: dict[str, str]):
    nlp = p.as_user("alice", "member", "nlp")
    r = nlp.post("/api/v1/datasets", json={"name": "corpus", "version": "v1", "source": corpus["url"],
                                           "description": "the training text"})
    assert r.status_code == 201, r.text
    got = r.json()
    assert (got["team"], got["checksum"], got["bytes"], got["files"], got["origin"], got["added_by"]) == (
        "nlp", corpus["checksum"], int(corpus["bytes"]), 1, "added", "alice")
    events = p.admin.get("/api/v1/events", params={"kind": "dataset.added"}).json()["events"]
    assert any("corpus:v1" in e["message"] for e in events)
    # immutable: the same version again is a 409, as is one the configuration lists
    r = nlp.post("/api/v1/datasets", json={"name": "corpus", "version": "v1", "source": corpus["url"]})
    assert r.status_code == 409 and r.json()["field"] == "version", r.text
    vision = p.as_user("victor", "member", "vision")
    r = vision.post("/api/v1/datasets", json={"name": "shared", "version": "v1", "source": corpus["url"]})
    assert r.status_code == 409, r.text
    # another team's name: its new versions are that team's to add
    r = vision.post("/api/v1/datasets", json={"name": "corpus", "version": "v2", "source": corpus["url"]})
    assert r.status_code == 403 and r.json()["field"] == "name", r.text


def test_a_given_checksum_must_match(p: Plane, corpus: dict[str, str]):
    nlp = p.as_user("alice", "member", "nlp")
    before = _count(p, "datasets")
    r = nlp.post("/api/v1/datasets", json={"name": "corpus", "version": "bad", "source": corpus["url"],
                                           "checksum": "sha256:" + "0" * 64})
    assert r.status_code == 422 and r.json()["field"] == "checksum", r.text
    r = nlp.post("/api/v1/datasets", json={"name": "corpus", "version": "v1.1", "source": corpus["url"],
                                           "checksum": corpus["checksum"]})
    assert r.status_code == 201, r.text
    assert _count(p, "datasets") == before + 1


def test_a_path_source_with_a_directory(p: Plane, tmp_path: Path):
    d = tmp_path / "images"
    (d / "a").mkdir(parents=True)
    (d / "a" / "x.bin").write_bytes(os.urandom(1000))
    (d / "y.txt").write_bytes(b"y")
    d.chmod(0o755)
    r = p.as_user("victor", "member", "vision").post(
        "/api/v1/datasets", json={"name": "pics", "version": "2026-12", "source": str(d)})
    assert r.status_code == 201, r.text
    assert (r.json()["bytes"], r.json()["files"]) == (1001, 2)


@pytest.mark.parametrize("body, status, field", [
    ({"name": "Bad"}, 422, "name"),
    ({"name": "9lives"}, 422, "name"),
    ({"version": "../x"}, 422, "version"),
    ({"source": "relative/path"}, 422, "source"),
    ({"source": "http://example.com/x"}, 422, "source"),
    ({"checksum": "md5:1234"}, 422, "checksum"),
    ({"checksum": "sha256:" + "A" * 64}, 422, "checksum"),
    ({"source": "/nonexistent/trainyard/data"}, 422, "source"),
    ({"source": "s3://not-configured/x"}, 422, "source"),
    ({"team": "speech"}, 422, "team"),
    ({"team": "vision"}, 403, "team"),
])
def test_bad_input_is_a_4xx_naming_the_field_and_nothing_is_written(p: Plane, body, status, field):
    nlp = p.as_user("alice", "member", "nlp")
    before = _count(p, "datasets"), _count(p, "events")
    r = nlp.post(
        "/api/v1/datasets", json={"name": "fresh", "version": "v1", "source": "/etc/hostname", **body})
    assert r.status_code == status, r.text
    detail = r.json()
    named = detail.get("field") or ".".join(str(x) for x in detail["detail"][0]["loc"][1:])
    assert named == field, r.text
    assert (_count(p, "datasets"), _count(p, "events")) == before


def test_each_team_sees_its_own_and_what_is_granted(p: Plane, corpus: dict[str, str]):
    nlp = p.as_user("alice", "member", "nlp")
    vision = p.as_user("victor", "member", "vision")
    seen = lambda c: {(d["name"], d["version"]) for d in c.get("/api/v1/datasets").json()["datasets"]}  # noqa: E731
    assert ("shared", "v1") in seen(nlp) and ("visionly", "v1") not in seen(nlp)  # the configuration's grant
    assert ("corpus", "v1") in seen(nlp) and ("corpus", "v1") not in seen(vision)
    assert {("corpus", "v1"), ("visionly", "v1")} <= seen(p.admin)
    assert vision.get("/api/v1/datasets/corpus/versions").status_code == 404
    shown = nlp.get("/api/v1/datasets/corpus/versions").json()
    assert shown["team"] == "nlp" and [v["version"] for v in shown["versions"]][:2] == ["v1.1", "v1"]
    assert nlp.get("/api/v1/datasets/corpus/versions", params={"version": "v9"}).status_code == 404
    # sharing is the owning team's (or an admin's)
    r = vision.post("/api/v1/datasets/corpus/grants", json={"team": "vision"})
    assert r.status_code == 404, r.text  # vision cannot even see it
    r = nlp.post("/api/v1/datasets/corpus/grants", json={"team": "speech"})
    assert r.status_code == 422 and r.json()["field"] == "team"
    r = nlp.post("/api/v1/datasets/shared/grants", json={"team": "vision"})
    assert r.status_code == 403, r.text  # vision's (configured) dataset
    r = nlp.post("/api/v1/datasets/corpus/grants", json={"team": "vision"})
    assert r.status_code == 200 and r.json()["grants"] == ["vision"] and r.json()["changed"], r.text
    assert ("corpus", "v1") in seen(vision)
    r = p.admin.post("/api/v1/datasets/visionly/grants", json={"team": "nlp"})
    assert r.status_code == 409, r.text  # a configured dataset's grants are the configuration's
    r = nlp.delete("/api/v1/datasets/corpus/grants/vision")
    assert r.status_code == 200 and r.json()["grants"] == [], r.text
    assert ("corpus", "v1") not in seen(vision)
    kinds = [e["kind"] for e in p.admin.get("/api/v1/events").json()["events"]]
    assert "dataset.granted" in kinds and "dataset.revoked" in kinds


def test_a_job_pins_each_dataset_at_submit(p: Plane, corpus: dict[str, str]):
    nlp = p.as_user("alice", "member", "nlp")
    job = p.submit(nlp, command=["true"], datasets=["corpus", "shared:v1"], hold=True)
    pinned = p.job(job["id"])["datasets"]
    assert [(d["name"], d["version"]) for d in pinned] == [("corpus", "v1.1"), ("shared", "v1")]  # the newest
    assert pinned[0]["checksum"] == corpus["checksum"] and pinned[0]["source"] == corpus["url"]
    assert pinned[0]["bytes"] == int(corpus["bytes"]) and pinned[0]["reader"] is None  # s3: the plane's credentials
    assert pinned[1] == {"name": "shared", "version": "v1", "checksum": CONFIGURED,
                         "source": pinned[1]["source"], "bytes": 0, "reader": None}
    # the catalogue may grow; the job keeps what it pinned
    r = nlp.post("/api/v1/datasets", json={"name": "corpus", "version": "v10", "source": corpus["url"]})
    assert r.status_code == 201
    assert p.job(job["id"])["datasets"][0]["version"] == "v1.1"
    assert p.submit(nlp, command=["true"], datasets=["corpus"], hold=True)["datasets"][0]["version"] == "v10"


@pytest.mark.parametrize("asked, status, field", [
    (["nothing"], 422, "datasets.0"),
    (["corpus:v99"], 422, "datasets.0"),
    (["corpus", "corpus:v1"], 422, "datasets.1"),
    (["corpus", "visionly"], 403, "datasets.1"),
    (["Corpus"], 422, "datasets"),
    (["corpus:"], 422, "datasets"),
])
def test_a_bad_dataset_at_submit_is_a_4xx_and_no_job(p: Plane, asked, status, field):
    nlp = p.as_user("alice", "member", "nlp")
    before = _count(p, "jobs")
    r = nlp.post("/api/v1/jobs", json={
        "command": ["true"], "workdir": str(p.cp.data_dir), "datasets": asked})
    assert r.status_code == status, r.text
    detail = r.json()
    named = detail.get("field") or ".".join(str(x) for x in detail["detail"][0]["loc"][1:])
    assert named == field, r.text
    assert _count(p, "jobs") == before


def test_an_unreachable_object_store_at_add(p: Plane, seaweed: SeaweedS3):  # noqa: F811
    """Last in the module: it stops the server."""
    url = seaweed.put("late/x", b"late")
    seaweed.stop()
    before = _count(p, "datasets")
    r = p.as_user("alice", "member", "nlp").post("/api/v1/datasets", json={"name": "late", "version": "v1",
                                                                             "source": url})
    assert r.status_code == 422 and r.json()["field"] == "source" and "unreachable" in r.text, r.text
    assert _count(p, "datasets") == before


@pytest.mark.parametrize("mode, content, said", [
    (0o644, "k\ns\n", "may be read by others"),
    (0o600, "only-one-line\n", "two lines"),
    (None, "", "no such file"),
])
def test_an_unusable_credentials_file_is_refused_at_apply(p: Plane, tmp_path: Path, mode, content, said):
    cred = tmp_path / "bad.cred"
    if mode is not None:
        cred.write_text(content)
        cred.chmod(mode)
    text = TWO_TEAMS.read_text() + f"""
storage:
  object_stores:
    - {{url: "s3://other-bucket", endpoint_url: "http://127.0.0.1:9", credentials_file: "{cred}"}}
"""
    before = len(p.admin.get("/api/v1/cluster/config/versions").json()["versions"])
    r = p.admin.post("/api/v1/cluster/config", json={"text": text})
    assert r.status_code == 400 and r.json()["field"] == "storage.object_stores.0.credentials_file", r.text
    assert said in r.text
    assert len(p.admin.get("/api/v1/cluster/config/versions").json()["versions"]) == before
