"""A job's image through the real API (issue 37): pyxis's options stored as the job's
`container` record, each part checked again server-side (422 naming `container.<part>`), the
team's default image applied, a registry the team may not use refused with the rule named
(403), and nothing stored by a refused submission. The plane runs the fake backend (nothing
here launches a container)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.helpers import store_snapshot
from tests.fake_plane import FakePlane
from tests.plane import identity_config_text

IMAGES = """
images:
  allowed_registries: ["127.0.0.1:5000", "nvcr.io", docker.io]
  default_image: "127.0.0.1:5000/base/python:3.11"
  teams:
    vision: {default_image: "nvcr.io#nvidia/pytorch:24.01-py3", allowed_registries: [nvcr.io]}
"""


@pytest.fixture(scope="module")
def p(tmp_path_factory):
    plane = FakePlane(tmp_path_factory.mktemp("containers") / "d")
    r = plane.admin.post("/api/v1/cluster/config", json={"text": identity_config_text() + IMAGES, "message": "images"})
    assert r.status_code == 200, r.text
    yield plane
    plane.stop()


def submit(p: FakePlane, client: Any = None, **body: Any) -> Any:
    body = {"command": ["true"], "hold": True, "workdir": str(p.cp.data_dir), **body}
    return (client or p.admin).post("/api/v1/jobs", json=body)


def test_the_options_are_stored_as_the_jobs_container_record(p: FakePlane) -> None:
    r = submit(p, team="nlp", container={
        "image": "alice@127.0.0.1:5000#team/img:1.0", "mounts": "/data:/data:ro,/scratch", "workdir": "/work",
        "env": ["HF_HOME", "HF_HOME", "WANDB_KEY"], "mount_home": True, "writable": False, "entrypoint": True,
        "remap_root": True})
    assert r.status_code == 201, r.text
    c = p.job(r.json()["id"])["container"]
    assert c == {"image": "127.0.0.1:5000/team/img:1.0",  # normalised; enroot's USER@ is not the image's name
                 "mounts": [{"src": "/data", "dst": "/data", "read_only": True, "flags": []},
                            {"src": "/scratch", "dst": "/scratch", "read_only": False, "flags": []}],
                 "workdir": "/work", "env": ["HF_HOME", "WANDB_KEY"], "mount_home": True, "writable": False,
                 "entrypoint": True, "remap_root": True}
    assert p.job(r.json()["id"])["image_digest"] is None  # pinned by the first attempt, not at submit


def test_the_teams_default_image_applies_to_a_job_that_names_none(p: FakePlane) -> None:
    vision = p.job(submit(p, team="vision").json()["id"])
    assert vision["container"]["image"] == "nvcr.io/nvidia/pytorch:24.01-py3"
    nlp = p.job(submit(p, team="nlp").json()["id"])  # no image of its own: the cluster's
    assert nlp["container"]["image"] == "127.0.0.1:5000/base/python:3.11"
    # options alone: the team's default image, with them
    j = p.job(submit(p, team="vision", container={"mounts": "/data", "writable": False}).json()["id"])
    assert j["container"]["image"] == "nvcr.io/nvidia/pytorch:24.01-py3" and not j["container"]["writable"]
    assert j["container"]["mounts"][0]["dst"] == "/data"


@pytest.mark.parametrize("container, field, words", [
    ({"image": "ubuntu", "mounts": "data:/data"}, "mounts", ["container.mounts", "absolute path"]),
    ({"image": "ubuntu", "mounts": "/a:/b:ro+rw"}, "mounts", ["both 'ro' and 'rw'"]),
    ({"image": "ubuntu", "mounts": "/a:/"}, "mounts", ["cannot replace the image's root"]),
    ({"image": "Ubuntu:22.04"}, "image", ["container.image", "lower case"]),
    ({"image": "ubuntu@sha256:abc"}, "image", ["bad digest"]),
    ({"image": "./img.sqsh"}, "image", ["file path"]),
    ({"image": "ubuntu", "workdir": "work"}, "workdir", ["absolute path"]),
    ({"image": "ubuntu", "env": ["A=B"]}, "env", ["not a variable name"]),
    ({"image": "ubuntu", "privileged": True}, "privileged", ["Extra inputs"]),
])
def test_a_malformed_part_is_a_422_naming_it_and_nothing_is_stored(p: FakePlane, container, field, words) -> None:
    before = store_snapshot(p)
    r = submit(p, team="nlp", container=container)
    assert r.status_code == 422, r.text
    d = r.json()["detail"][0]
    assert d["loc"][:3] == ["body", "container", field], d
    for w in words:
        assert w in d["msg"], d
    assert store_snapshot(p) == before


def test_a_registry_the_team_may_not_use_is_a_403_naming_the_rule(p: FakePlane) -> None:
    before = store_snapshot(p)
    r = submit(p, team="vision", container={"image": "127.0.0.1:5000/team/img:1.0"})
    assert r.status_code == 403, r.text
    assert r.json() == {"field": "container.image", "detail": "registry '127.0.0.1:5000' is not allowed for team "
                        "'vision' (images.teams.vision.allowed_registries: nvcr.io)"}
    r = submit(p, team="nlp", container={"image": "ghcr.io/org/img:2"})
    assert r.status_code == 403 and "images.allowed_registries: 127.0.0.1:5000, nvcr.io, registry-1.docker.io" \
        in r.json()["detail"], r.text
    assert submit(p, team="nlp", container={"image": "ubuntu:24.04"}).status_code == 201  # docker.io, as listed
    assert store_snapshot(p)["jobs"][:-1] == before["jobs"]


def test_who_may_not_manage_the_job_sees_its_image_but_not_its_mounts(p: FakePlane) -> None:
    jid = submit(p, team="nlp", container={"image": "ubuntu:24.04", "mounts": "/secret/path"}).json()["id"]
    viewer = p.as_user("val", "viewer")
    seen = viewer.get(f"/api/v1/jobs/{jid}").json()
    assert seen["container"] == {"image": "registry-1.docker.io/library/ubuntu:24.04"}
    listed = viewer.get("/api/v1/jobs", params={"fields": "id,container,image_digest"}).json()["jobs"]
    assert {"id": jid, "container": {"image": "registry-1.docker.io/library/ubuntu:24.04"},
            "image_digest": None} in listed
    assert p.admin.get(f"/api/v1/jobs/{jid}").json()["container"]["mounts"][0]["src"] == "/secret/path"


def test_an_array_gives_every_task_the_container(p: FakePlane) -> None:
    jid = submit(p, team="nlp", array="0-2", container={"image": "ubuntu:24.04"}).json()["id"]
    tasks = p.admin.get("/api/v1/jobs", params={"array": jid, "fields": "id,container"}).json()["jobs"]
    assert len(tasks) == 3 and {t["container"]["image"] for t in tasks} == {"registry-1.docker.io/library/ubuntu:24.04"}
