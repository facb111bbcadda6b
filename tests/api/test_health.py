"""`/healthz` and `/readyz` tell the truth: a stopped loop, a read-only store, a full disk and a dead
background thread each turn /healthz to 503 with the reason; /readyz is off before the first pass
and while stopping. Overload answers 503 with Retry-After, and the CLI waits and retries.
Real plane, real SQLite on a real (small) file system."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest
from sqlalchemy import select

from tests.mounts import fill, tmpfs
from tests.plane import Plane, wait_until
from trainyard.control.lifecycle import supervise
from trainyard.store.models import EventRow


def health(p: Plane) -> tuple[int, dict]:
    p.cp.liveness._cached = None  # the report is cached for a second; these tests change things faster
    r = p.http.get("/healthz")
    return r.status_code, r.json()


@pytest.fixture
def plane(tmp_path):
    p = Plane(tmp_path / "yard")
    yield p
    p.cp.stop()


def test_healthy_plane_is_200_with_every_check_and_the_loop_passes(plane):
    wait_until(lambda: plane.cp.loop.stats.steps > 0)
    code, body = health(plane)
    assert code == 200 and body["ok"] is True
    assert set(body["checks"]) == {"loop", "store", "disk", "threads"}
    assert all(c["ok"] for c in body["checks"].values())
    # loop, health checks, retention, storage, telemetry, checkpoint tiers
    assert body["checks"]["threads"]["detail"].startswith("6 running")
    assert body["loop"]["passes"]["count"] >= 1 and "p99_ms" in body["loop"]["passes"]
    assert plane.http.get("/readyz").json() == {"ready": True, "detail": "ready"}


def test_a_stopped_loop_is_503(plane):
    wait_until(lambda: plane.cp.loop.stats.steps > 0)
    plane.cp.loop.stop()
    code, body = health(plane)
    assert code == 503 and body["checks"]["loop"]["ok"] is False
    assert "not running" in body["checks"]["loop"]["detail"]


def test_readyz_is_off_before_the_first_pass_and_while_stopping(tmp_path):
    p = Plane(tmp_path / "yard", start=False)
    try:
        r = p.http.get("/readyz")
        assert r.status_code == 503 and "no control loop pass yet" in r.json()["detail"]
        p.cp.start()
        wait_until(lambda: p.http.get("/readyz").status_code == 200)
        p.cp.liveness.shutting_down = True  # what SIGTERM does first (cli/serve.py)
        r = p.http.get("/readyz")
        assert r.status_code == 503 and r.json()["detail"] == "shutting down"
    finally:
        p.cp.stop()


def test_a_full_data_disk_is_503(tmp_path):
    with tmpfs(tmp_path / "fs", 48) as fs:
        p = Plane(fs / "yard")
        try:
            p.cp.liveness.min_free_bytes = 8 * 2**20
            wait_until(lambda: p.cp.loop.stats.steps > 0)
            assert health(p)[0] == 200
            ballast = fill(fs, 4 * 2**20)
            code, body = health(p)
            assert code == 503 and body["checks"]["disk"]["ok"] is False
            assert "under the 8 MiB floor" in body["checks"]["disk"]["detail"]
            ballast.unlink()
            assert health(p)[0] == 200
        finally:
            p.cp.stop()


def test_a_store_that_cannot_commit_is_503(tmp_path):
    """The store's files made immutable (as a file system gone read-only under the plane): taking
    the write lock still works, the commit fails; /healthz must see the commit."""
    p = Plane(tmp_path / "yard", start=False)
    files = [str(p.cp.data_dir / n) for n in ("trainyard.db", "trainyard.db-wal")]
    try:
        assert health(p)[1]["checks"]["store"]["ok"] is True
        subprocess.run(["chattr", "+i", *files], check=True)
        code, body = health(p)
        assert code == 503 and body["checks"]["store"]["ok"] is False
        assert "cannot take writes" in body["checks"]["store"]["detail"]
    finally:
        subprocess.run(["chattr", "-i", *files])
        p.cp.stop()
    assert health(p)[1]["checks"]["store"]["ok"] is True


def test_a_dead_health_thread_comes_back_with_an_event_and_a_metric(tmp_path, monkeypatch):
    monkeypatch.setattr(supervise, "FIRST_PAUSE_S", 0.05)
    p = Plane(tmp_path / "yard", start=False)
    try:
        real, calls = p.cp.loop.health.spec_of, []

        def flaky():  # the store refused the read, once
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("database is locked")
            return real()

        p.cp.loop.health.spec_of = flaky
        p.cp.start()
        wait_until(lambda: len(calls) >= 2)
        th = p.cp.loop.health.thread
        assert th.alive and th.stats.restarts == 1
        with p.cp.store.session() as s:
            ev = s.scalars(select(EventRow).where(EventRow.kind == "thread.restarted")).all()
        assert [e.data["thread"] for e in ev] == ["trainyard-health"]
        assert "database is locked" in ev[0].message
        metrics = p.admin.get("/metrics").text
        assert 'trainyard_thread_restarts_total{thread="trainyard-health"} 1.0' in metrics
        assert 'trainyard_thread_alive{thread="trainyard-loop"} 1.0' in metrics
        assert 'trainyard_thread_alive{thread="trainyard-retention"} 1.0' in metrics
        assert "trainyard_data_disk_free_bytes" in metrics and "trainyard_loop_pass_seconds" in metrics
        code, body = health(p)
        assert code == 200 and "restarts {'trainyard-health': 1}" in body["checks"]["threads"]["detail"]
    finally:
        p.cp.stop()


def test_overload_is_503_with_retry_after_but_health_is_always_answered(plane):
    counts = plane.app.state.admission
    counts.max_requests = 0  # as if every slot were taken
    r = plane.admin.get("/api/v1/jobs")
    assert r.status_code == 503 and r.headers["retry-after"] == "1" and "busy" in r.json()["detail"]
    assert plane.http.get("/healthz").status_code in (200, 503) and plane.http.get("/readyz").status_code == 200
    assert plane.admin.get("/metrics").status_code == 200
    assert counts.refused == 1
    counts.max_requests = 64
    assert plane.admin.get("/api/v1/jobs").status_code == 200


def test_a_log_follower_holds_no_worker_thread(plane):
    """Many `logs -f` at once leave the API's threads free: a request still answers at once."""
    jid = plane.submit(command=["sleep", "30"], team="vision")["id"]
    plane.wait(jid, "RUNNING")
    before = threading.active_count()
    streams = []
    for _ in range(12):
        cm = plane.admin.stream("GET", f"/api/v1/jobs/{jid}/logs", params={"follow": "true"})
        streams.append((cm, cm.__enter__()))
    try:
        t0 = time.monotonic()
        assert plane.admin.get("/api/v1/jobs").status_code == 200
        assert time.monotonic() - t0 < 10
        assert plane.app.state.admission.streams == 12
    finally:
        for cm, _ in streams:
            cm.__exit__(None, None, None)
    assert threading.active_count() <= before + 16
