"""GET /metrics: Prometheus text a real scraper parses, with the fault accounting of issue 5
(attempts by cause, lost GPU-seconds, recovery time), counted from the store; reads need a token."""

from __future__ import annotations

import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.plane import Plane

WORK = [sys.executable, "-m", "trainyard.demo.work", "--steps", "20", "--step-time", "0.1", "--ckpt-every", "5"]


@pytest.fixture
def plane(tmp_path):
    p = Plane(tmp_path / "yard")
    yield p
    p.stop()


def scrape(client) -> dict[tuple[str, tuple], float]:  # noqa: ANN001
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def test_a_crash_and_its_recovery_are_counted_by_team_and_cause(plane):
    j = plane.submit(command=WORK, gpus=2, team="vision")
    plane.wait(j["id"], "RUNNING")
    ck = plane.cp.data_dir / "jobs" / str(j["id"]) / "checkpoints"
    deadline = time.monotonic() + 20
    while not (ck / "step-5" / "COMMITTED").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)  # a few steps past the checkpoint: work to lose
    plane.cp.backend.kill_rank(j["id"], 1, 1)
    plane.wait(j["id"], lambda x: x["state"] == "RUNNING" and x["attempt"] == 2, timeout=30)
    # the runtime's first step report of attempt 2 (this in-process plane has no URL to give the job)
    r = plane.admin.post(f"/api/v1/jobs/{j['id']}/progress",
                         json={"attempt": 2, "step": 6, "time": time.time(), "event": "progress"})
    assert r.status_code == 200 and r.json()["accepted"], r.text
    done = plane.wait(j["id"], "COMPLETED", timeout=40)
    crash = done["attempts"][0]
    assert crash["cause"] == "crash" and crash["lost_gpu_s"] > 0

    m = scrape(plane.as_user("watcher", "viewer"))
    vision = ("team", "vision")
    assert m[("trainyard_attempts_ended_total", (("cause", "crash"), vision))] == 1
    assert m[("trainyard_attempts_ended_total", (("cause", "completed"), vision))] == 1
    assert m[("trainyard_lost_gpu_seconds_total", (("cause", "crash"), vision))] == pytest.approx(crash["lost_gpu_s"])
    assert m[("trainyard_recovery_seconds_count", (vision,))] == 1
    assert m[("trainyard_recovery_seconds_sum", (vision,))] == pytest.approx(crash["recover_s"])
    assert m[("trainyard_recovery_seconds_bucket", (("le", "+Inf"), vision))] == 1
    assert m[("trainyard_job_retries_total", (vision,))] == 1
    assert m[("trainyard_jobs", (("state", "COMPLETED"), vision))] == 1


def test_metrics_need_a_token(plane):
    assert plane.client("").get("/metrics").status_code == 401  # roles: tests/api/test_roles.py


FAMILIES = {  # issue 7, item 3: every family, whether or not it has samples yet
    "trainyard_gpus", "trainyard_nodes", "trainyard_gpu_utilization_ratio", "trainyard_queue_length",
    "trainyard_queue_wait_seconds", "trainyard_jobs", "trainyard_attempts_ended", "trainyard_job_failures",
    "trainyard_preemptions", "trainyard_lost_gpu_seconds", "trainyard_recovery_seconds", "trainyard_job_retries",
    "trainyard_job_checkpoint_age_seconds",
}


def test_the_cluster_and_queue_families_are_there_with_the_right_numbers(plane):
    running = plane.submit(command=WORK, gpus=2, team="vision")
    plane.wait(running["id"], "RUNNING")
    held = plane.submit(command=WORK, gpus=1, team="nlp", hold=True, **{"class": "batch"})
    plane.admin.post("/api/v1/nodes/node-1/drain", json={"reason": "maintenance"})
    r = plane.as_user("watcher", "viewer").get("/metrics")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert FAMILIES <= set(families), FAMILIES - set(families)
    m = scrape(plane.as_user("watcher", "viewer"))
    pool = ("pool", "default")
    assert m[("trainyard_gpus", (pool, ("state", "total")))] == 8
    assert m[("trainyard_gpus", (pool, ("state", "allocated")))] == 2
    assert m[("trainyard_gpus", (pool, ("state", "idle")))] == 6
    assert m[("trainyard_nodes", (pool, ("state", "up")))] == 1 and m[("trainyard_nodes", (pool, ("state", "drain")))] == 1
    assert m[("trainyard_queue_length", (("class", "batch"), ("team", "nlp")))] == 1
    assert m[("trainyard_queue_wait_seconds_count", (("class", "training"), ("team", "vision")))] == 1
    age = m[("trainyard_job_checkpoint_age_seconds", (("job", str(running["id"])), ("team", "vision")))]
    assert 0 <= age < 30
    assert held["state"] in ("PENDING",)
