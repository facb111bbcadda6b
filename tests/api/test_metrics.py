"""GET /metrics: Prometheus text a real scraper parses, with the fault accounting of issue 5
(attempts by cause, lost GPU-seconds, recovery time), counted from the store; reads need a token."""

from __future__ import annotations

import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.plane import Plane, job_dir

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
    ck = job_dir(plane.cp.data_dir, j["id"]) / "checkpoints"
    deadline = time.monotonic() + 120
    while not (ck / "step-5" / "COMMITTED").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)  # a few steps past the checkpoint: work to lose
    plane.cp.backend.kill_rank(j["id"], 1, 1)
    plane.wait(j["id"], lambda x: x["state"] == "RUNNING" and x["attempt"] == 2, timeout=120)
    # the runtime's first step report of attempt 2 (this in-process plane has no URL to give the job)
    r = plane.admin.post(f"/api/v1/jobs/{j['id']}/progress",
                         json={"attempt": 2, "step": 6, "time": time.time(), "event": "progress"})
    assert r.status_code == 200 and r.json()["accepted"], r.text
    done = plane.wait(j["id"], "COMPLETED", timeout=120)
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
    # the goodput ledger of both ended attempts, by bucket: all their GPU-seconds, the crash's lost work recomputed
    ledger = {dict(k[1])["bucket"]: v for k, v in m.items() if k[0] == "trainyard_goodput_gpu_seconds_total"
              and dict(k[1])["team"] == "vision"}
    assert sum(ledger.values()) == pytest.approx(sum(2 * (a["ended_at"] - a["started_at"]) for a in done["attempts"]))
    assert ledger["recompute"] == pytest.approx(crash["lost_gpu_s"])


def test_metrics_need_a_token(plane):
    assert plane.client("").get("/metrics").status_code == 401  # roles: tests/api/test_roles.py


FAMILIES = {  # issue 7, item 3: every family, whether or not it has samples yet
    "trainyard_gpus", "trainyard_nodes", "trainyard_gpu_utilization_ratio", "trainyard_queue_length",
    "trainyard_queue_wait_seconds", "trainyard_jobs", "trainyard_attempts_ended", "trainyard_job_failures",
    "trainyard_preemptions", "trainyard_lost_gpu_seconds", "trainyard_recovery_seconds", "trainyard_job_retries",
    "trainyard_job_checkpoint_age_seconds",
    # issue 18: teams, quotas, GPU-hours
    "trainyard_team_gpus_allocated", "trainyard_team_gpus_borrowed", "trainyard_team_quota_nominal_gpus",
    "trainyard_team_quota_borrowing_limit_gpus", "trainyard_team_quota_lending_limit_gpus", "trainyard_gpu_seconds",
    # issue 39: the goodput ledger
    "trainyard_goodput_gpu_seconds",
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
    age = m[("trainyard_job_checkpoint_age_seconds", (("job_id", str(running["id"])), ("team", "vision")))]
    assert 0 <= age < 30
    assert held["state"] in ("PENDING",)


def test_team_gauges_quotas_and_gpu_hours(plane):
    j = plane.submit(command=WORK, gpus=3, team="vision", name="three")
    plane.wait(j["id"], "RUNNING")
    m = scrape(plane.as_user("watcher", "viewer"))
    vision, nlp, pool = ("team", "vision"), ("team", "nlp"), ("pool", "default")
    assert m[("trainyard_team_gpus_allocated", (pool, vision))] == 3
    assert m[("trainyard_team_gpus_allocated", (pool, nlp))] == 0
    assert m[("trainyard_team_gpus_borrowed", (pool, vision))] == 0
    assert m[("trainyard_team_quota_nominal_gpus", (pool, vision))] == 4
    assert m[("trainyard_team_quota_borrowing_limit_gpus", (pool, nlp))] == 4
    assert ("trainyard_team_quota_lending_limit_gpus", (pool, vision)) not in m  # none set: unlimited
    key = ("trainyard_gpu_seconds_total", (("class", "training"), vision, ("user", "admin")))
    first = m[key]
    assert first > 0
    done = plane.wait(j["id"], "COMPLETED", timeout=120)
    m = scrape(plane.admin)
    a = done["attempts"][0]
    assert m[key] == pytest.approx(3 * (a["ended_at"] - a["started_at"])) and m[key] >= first
    assert ("trainyard_job_checkpoint_age_seconds", (("job", str(j["id"])), vision)) not in m


def test_no_label_is_named_job(plane):
    """Prometheus's target label is `job`: a label of ours by that name arrives as `exported_job`."""
    j = plane.submit(command=WORK, gpus=1, team="nlp")
    plane.wait(j["id"], "RUNNING")
    text = plane.admin.get("/metrics").text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            assert "job" not in s.labels, (s.name, s.labels)
    assert f'job_id="{j["id"]}"' in text


def test_promtool_finds_nothing_to_complain_about(plane):
    """`promtool check metrics` (Prometheus's own linter) on a scrape with every family filled."""
    import shutil
    import subprocess
    from pathlib import Path

    from tests.setup_once import install_once

    script = Path(__file__).parents[2] / "scripts" / "promtool-setup.sh"
    failed = install_once(script, lambda: shutil.which("promtool") is None, "TRAINYARD_PROMTOOL_NO_INSTALL")
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(f"promtool is not installed and scripts/{script.name} could not install it: {failed}")
    j = plane.submit(command=WORK, gpus=2, team="vision")
    plane.wait(j["id"], "COMPLETED", timeout=120)
    plane.submit(command=WORK, gpus=1, team="nlp", hold=True)
    text = plane.admin.get("/metrics").text
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr
