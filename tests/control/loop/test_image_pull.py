"""The image step of an attempt's start (control/loop/image_pull.py) and the bare gang's
environment check (control/loop/fingerprints.py), on the fake backend and a fake clock: the job
shows CONFIGURING/ImagePull while its nodes pull, its time starts with its ranks, the digest is
pinned once, and a failed pull ends the attempt as the user's or the registry's fault.

The real pulls (a loopback registry, skopeo, the node caches, runc) are tests/images/ and
tests/scenarios/test_images.py."""

from __future__ import annotations

import threading

import pytest

from tests.fake_plane import FakePlane, fake
from tests.plane import TWO_TEAMS
from trainyard.backends.fake import ENVIRONMENT
from trainyard.images.types import NOT_FOUND, UNREACHABLE, ImagePullError

DIGEST = "sha256:" + "5e" * 32
IMAGE = f"127.0.0.1:5000/vision/env@{DIGEST}"  # pinned by the user: no registry asked


def _plane(tmp_path, images: str = "") -> FakePlane:
    config = tmp_path / "c.yaml"
    config.write_text(TWO_TEAMS.read_text() + images)
    return FakePlane(tmp_path / "plane", config=config)


@pytest.fixture
def plane(tmp_path):
    p = _plane(tmp_path)
    yield p
    p.stop()


def _submit(p: FakePlane, **more) -> int:
    body = {"name": "img", "team": "vision", "gpus": 2, "command": fake("run=5"), "container": {"image": IMAGE}}
    return p.submit(**{**body, **more})["id"]


def test_the_job_configures_while_its_nodes_pull_and_its_time_starts_with_its_ranks(plane):
    p = plane
    gate = threading.Event()
    p.backend.cluster.pull_gate = gate
    job = _submit(p)
    j = p.wait(job, lambda j: j["state"] == "CONFIGURING" and j["image_digest"])  # pinned before the pull
    assert j["reason"] == "ImagePull"
    assert j["image_digest"] == DIGEST
    p.run(30)  # a long pull: still configuring, its GPUs held
    j = p.job(job)
    assert j["state"] == "CONFIGURING"
    opened = p.clock()
    gate.set()
    j = p.wait(job, "RUNNING")
    assert j["start_time"] >= opened - 1e-6, (j["start_time"], opened)  # the pull was not the job's time
    j = p.wait(job, "COMPLETED")
    assert [a["image_digest"] for a in j["attempts"]] == [DIGEST]
    kinds = [e["kind"] for e in p.events(job)]
    assert "job.image_pinned" in kinds and "job.image_ready" in kinds, kinds
    assert p.backend.cluster.pulls == [("node-0", f"127.0.0.1:5000/vision/env@{DIGEST}")] or \
        [n for n, _ in p.backend.cluster.pulls] in (["node-0"], ["node-1"])


def test_an_image_the_registry_lacks_fails_the_job_as_the_users_error(plane):
    p = plane
    p.backend.cluster.pull_errors[DIGEST] = ImagePullError(NOT_FOUND, IMAGE, "manifest unknown")
    job = _submit(p)
    j = p.wait(job, "FAILED")
    assert j["reason"].startswith("ImagePullError: ") and "manifest unknown" in j["reason"], j["reason"]
    assert j["attempts"][0]["state"] == "FAILED"


def test_a_registry_that_does_not_answer_requeues_it_not_counted_against_its_retries(plane):
    p = plane
    p.backend.cluster.pull_errors[DIGEST] = ImagePullError(UNREACHABLE, IMAGE, "connection refused")
    job = _submit(p)
    j = p.wait(job, lambda j: j["state"] == "REQUEUED")
    assert j["reason"] == "ImagePullError", j["reason"]
    assert j["attempts"][0]["state"] == "REQUEUED"
    # back in the queue after a pause; the registry returns
    del p.backend.cluster.pull_errors[DIGEST]
    j = p.wait(job, "COMPLETED", timeout=300)
    assert len(j["attempts"]) == 2 and j["attempts"][1]["image_digest"] == DIGEST
    requeued = [e for e in p.events(job) if e["kind"] == "job.requeued"]
    assert requeued and "not counted against its retries" in requeued[0]["message"]


def test_a_registry_down_for_good_fails_the_job_after_five_tries(plane):
    p = plane
    p.backend.cluster.pull_errors[DIGEST] = ImagePullError(UNREACHABLE, IMAGE, "connection refused")
    job = _submit(p)
    j = p.wait(job, "FAILED", timeout=3600)
    assert len(j["attempts"]) == 5 and j["reason"].startswith("ImagePullError"), (len(j["attempts"]), j["reason"])


def test_a_bare_gang_on_nodes_that_differ_is_refused_naming_the_node(tmp_path):
    p = _plane(tmp_path, "images: {fingerprint: refuse}\n")
    try:
        p.backend.cluster.environments["node-1"] = {**ENVIRONMENT, "torch": "2.14.1"}
        job = p.submit(name="gang", team="vision", gpus=8, command=fake("run=5"))["id"]
        j = p.wait(job, "FAILED")
        assert j["reason"].startswith("EnvironmentMismatch") and "node-1: torch 2.14.1" in j["reason"], j["reason"]
        # one node, or alike nodes: no check fails it
        p.backend.cluster.environments.clear()
        p.cp.loop.ctx.fingerprints.forget()
        ok = p.submit(name="gang2", team="vision", gpus=8, command=fake("run=5"))["id"]
        assert p.wait(ok, ("COMPLETED", "FAILED"))["state"] == "COMPLETED"
    finally:
        p.stop()


def test_warn_lets_the_gang_run_and_says_so(tmp_path):
    p = _plane(tmp_path, "images: {fingerprint: warn}\n")
    try:
        p.backend.cluster.environments["node-1"] = {**ENVIRONMENT, "python": "3.12.1"}
        job = p.submit(name="gang", team="vision", gpus=8, command=fake("run=5"))["id"]
        assert p.wait(job, ("COMPLETED", "FAILED"))["state"] == "COMPLETED"
        ev = [e for e in p.events(job) if e["kind"] == "job.environment_differs"]
        assert ev and "node-1: python 3.12.1" in ev[0]["message"], ev
    finally:
        p.stop()
