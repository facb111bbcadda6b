"""`yard image pull|ls|rm` through the real API on a plane with the fake backend (each node's cache
a dict: backends/fake.py), and the digest resolved by the real registry client against a real
loopback registry (the image tests' registry and built images, helper A's): who may, which nodes, one
line per node, an unknown image a 422 and a registry down a 502 with nothing cached. (An entry a
running container holds, kept by `yard image rm`, needs the local backend's cache: the lead's part.)"""

from __future__ import annotations

from typing import Any

import pytest

from tests import image_tools
from tests.api.helpers import store_snapshot
from tests.fake_plane import FakePlane
from trainyard.images.types import DISK_FULL, ImagePullError


D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
IMG = "127.0.0.1:5000/team/img"


@pytest.fixture
def p(tmp_path):
    plane = FakePlane(tmp_path / "d")
    yield plane
    plane.stop()


def pull(p: FakePlane, image: str, nodes: str | None = None, client: Any = None) -> Any:
    return (client or p.admin).post("/api/v1/images/pull", json={"image": image, "nodes": nodes})


def entries(p: FakePlane, node: str | None = None, client: Any = None) -> list[dict[str, Any]]:
    r = (client or p.admin).get("/api/v1/images", params={"node": node} if node else None)
    assert r.status_code == 200, r.text
    return r.json()["images"]


def test_a_pinned_image_is_pulled_on_every_node_then_listed_and_removed(p: FakePlane) -> None:
    r = pull(p, f"{IMG}:1@{D1}")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["image"] == f"{IMG}:1@{D1}" and out["digest"] == D1
    assert [(n["node"], n["ok"]) for n in out["nodes"]] == [("node-0", True), ("node-1", True)]
    assert sorted(p.backend.cluster.pulls) == [("node-0", f"{IMG}:1@{D1}"), ("node-1", f"{IMG}:1@{D1}")]
    assert pull(p, f"{IMG}@{D2}", nodes="node-1").status_code == 200
    assert [(e["node"], e["digest"]) for e in entries(p)] == [("node-0", D1), ("node-1", D1), ("node-1", D2)]
    assert [e["digest"] for e in entries(p, "node-1")] == [D1, D2]
    # by digest on one node, then by repository everywhere
    r = p.admin.post("/api/v1/images/remove", json={"image": D2, "nodes": "node-1"})
    assert r.status_code == 200 and [x["removed"] for x in r.json()["removed"]] == [True], r.text
    r = p.admin.post("/api/v1/images/remove", json={"image": f"{IMG}:whatever"})
    assert sorted((x["node"], x["digest"], x["removed"]) for x in r.json()["removed"]) == [
        ("node-0", D1, True), ("node-1", D1, True)]
    assert entries(p) == []
    r = p.admin.post("/api/v1/images/remove", json={"image": D1})
    assert r.status_code == 404 and r.json()["field"] == "image", r.text
    kinds = [e["kind"] for e in p.admin.get("/api/v1/events", params={"limit": 50}).json()["events"]]
    assert kinds.count("image.pulled") == 2 and kinds.count("image.removed") == 2


def test_one_nodes_failure_is_its_line_and_the_others_are_pulled(p: FakePlane) -> None:
    p.backend.cluster.pull_errors[D1] = ImagePullError(DISK_FULL, f"{IMG}@{D1}", "no room on node-1's cache")
    # (scripted per digest: both nodes fail the same way here; one node's own failure comes from its cache)
    r = pull(p, f"{IMG}@{D1}")
    assert r.status_code == 200, r.text
    assert {(n["node"], n["ok"], n["kind"]) for n in r.json()["nodes"]} == {("node-0", False, DISK_FULL),
                                                                            ("node-1", False, DISK_FULL)}
    assert "no room" in r.json()["nodes"][0]["error"]
    assert entries(p) == []


def test_who_may_and_what_is_refused(p: FakePlane) -> None:
    member, operator = p.as_user("alice", "member", "vision"), p.as_user("olga", "operator")
    before = store_snapshot(p)
    r = pull(p, f"{IMG}@{D1}", client=operator)
    assert r.status_code == 403 and "only an admin" in r.json()["detail"], r.text
    assert p.admin.post("/api/v1/images/remove", json={"image": D1}, headers=operator.headers).status_code == 403
    assert entries(p, client=operator) == []  # operators see the caches, as they see nodes
    assert member.get("/api/v1/images").status_code == 403
    r = pull(p, f"{IMG}@{D1}", nodes="node-[0-7]")
    assert r.status_code == 404 and r.json() == {"detail": "no node 'node-2' in the configuration", "field": "nodes"}
    r = pull(p, "Team/Img:1")
    assert r.status_code == 422 and r.json()["field"] == "image" and "lower case" in r.json()["detail"], r.text
    r = p.admin.post("/api/v1/images/remove", json={"image": "sha256:abc"})
    assert r.status_code == 422 and "bad digest" in r.json()["detail"], r.text
    assert store_snapshot(p) == before and p.backend.cluster.pulls == []


# -- the digest resolved by the real registry client -------------------------------------------------

def test_a_tag_is_resolved_once_against_a_real_registry_and_every_node_gets_that_digest(tmp_path) -> None:
    why = image_tools.unavailable()
    if why:
        pytest.skip(why)
    import json

    from tests.image_builds import tiny
    from tests.image_registry import Registry

    (tmp_path / "registry").mkdir()
    reg = Registry(tmp_path / "registry")
    reg.start()
    plane = FakePlane(tmp_path / "d")
    try:
        image = tiny()
        image.push(reg.address, "team/tiny:1")
        index = json.loads((image.layout / "index.json").read_text())  # the manifest's digest, as built
        digest = next(m["digest"] for m in index["manifests"]
                      if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == image.tag)
        r = pull(plane, f"{reg.address}/team/tiny:1")
        assert r.status_code == 200, r.text
        assert r.json()["digest"] == digest
        assert sorted(plane.backend.cluster.pulls) == [("node-0", f"{reg.address}/team/tiny:1@{digest}"),
                                                       ("node-1", f"{reg.address}/team/tiny:1@{digest}")]
        r = pull(plane, f"{reg.address}/team/nothing:1")
        assert r.status_code == 422 and "(not_found)" in r.json()["detail"], r.text
        reg.stop()
        r = pull(plane, f"{reg.address}/team/tiny:1")
        assert r.status_code == 502 and "(unreachable)" in r.json()["detail"], r.text
        assert len(plane.backend.cluster.pulls) == 2  # no node was asked after a failed resolve
    finally:
        plane.stop()
        reg.stop()


def test_an_image_no_team_may_run_is_not_pre_staged(tmp_path) -> None:
    from tests.plane import identity_config_text

    p = FakePlane(tmp_path / "d")
    try:
        r = p.admin.post("/api/v1/cluster/config", json={
            "text": identity_config_text() + "images: {allowed_registries: ['127.0.0.1:5000']}\n"})
        assert r.status_code == 200, r.text
        r = pull(p, f"ghcr.io/x/y@{D1}")
        assert r.status_code == 403 and r.json() == {
            "field": "image", "detail": "registry 'ghcr.io' is not allowed on this cluster "
                                        "(images.allowed_registries: 127.0.0.1:5000)"}, r.text
        assert p.backend.cluster.pulls == []
        assert pull(p, f"{IMG}@{D1}").status_code == 200
    finally:
        p.stop()
