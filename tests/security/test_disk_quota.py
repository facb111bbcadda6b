"""Disk per team (issue 34, point 6): one team's checkpoints must not fill the disk every team
needs. The attack: a member's job writes until the disk is full; before, every team's next
submission got 507 and nothing of anyone's started. Now the team over its storage quota waits
(StorageQuota) while the others run, its running jobs are warned once, and deleting the files lets
it start again; and with job dirs on their own file system (`yard up --jobs-dir`) a full one
leaves the store's disk alone: submissions are taken, new attempts wait for the reserve
(DiskReserve). A root plane, real accounts (`useradd`), real processes, a real tmpfs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.accounts import ROOT_ONLY, Accounts, accounts, shared_dir
from tests.mounts import tmpfs
from tests.plane import TWO_TEAMS, Plane, job_dir, wait_until

pytestmark = ROOT_ONLY

FAST = "storage: {interval: 0.2s}\n"
# attempt 1 writes 5 MB of checkpoint; every attempt then runs on
FILL_5MB = ('if [ "$TRAINYARD_ATTEMPT" = 1 ]; then head -c 5000000 /dev/zero > "$TRAINYARD_CHECKPOINT_DIR/ballast"; '
            'fi; echo filled; exec sleep 120')
FILL_ALL = 'head -c 100000000 /dev/zero > "$TRAINYARD_CHECKPOINT_DIR/ballast"; echo filled; exec sleep 120'


def config(acc: Accounts, vision_storage: str = "", extra: str = FAST) -> str:
    text = TWO_TEAMS.read_text()
    text = text.replace("  - name: vision\n", f"  - name: vision\n    group: {acc.group('vis')}\n{vision_storage}")
    text = text.replace("  - name: nlp\n", f"  - name: nlp\n    group: {acc.group('nlp')}\n")
    return text + f"users:\n  alice: {acc.user('alice')}\n  bob: {acc.user('bob')}\n" + extra


@pytest.fixture(scope="module")
def acc() -> Iterator[Accounts]:
    with accounts({"alice": ["vis"], "bob": ["nlp"]}, ["vis", "nlp"]) as a:
        yield a


def kinds(p: Plane, job: int | None = None) -> list[str]:
    params = {"limit": 10000} | ({"job": job} if job is not None else {})
    return [e["kind"] for e in p.admin.get("/api/v1/events", params=params).json()["events"]]


def stays(p: Plane, job: int, reason: str, seconds: float = 2.0) -> None:
    """`job` waits with `reason`, and still does after `seconds` (several measurements and passes)."""
    p.wait(job, lambda j: j["reason"] == reason, timeout=30)
    time.sleep(seconds)
    j = p.job(job)
    assert j["state"] in ("PENDING", "REQUEUED") and j["reason"] == reason, j


def test_a_team_over_its_quota_waits_while_others_run_and_starts_again_once_it_deletes(acc):
    with shared_dir("ty-quota-") as d:
        cfg = d / "cluster.yaml"
        cfg.write_text(config(acc, "    storage: {quota_gb: 0.001}\n"))  # about 1 MiB for vision
        p = Plane(d / "yard", config=cfg, run_as=None, allow_root_jobs=None)
        try:
            alice, bob = p.as_user("alice", "member", "vision"), p.as_user("bob", "member", "nlp")
            a1 = p.submit(alice, command=["/bin/sh", "-c", FILL_5MB])["id"]
            p.wait(a1, "RUNNING")
            ballast = job_dir(p.cp.data_dir, a1) / "checkpoints" / "ballast"
            wait_until(lambda: ballast.exists() and ballast.stat().st_size == 5_000_000, timeout=60)

            def vision() -> dict:
                return next(t for t in p.admin.get("/api/v1/storage").json()["teams"] if t["team"] == "vision")
            wait_until(lambda: vision()["over"] and vision()["bytes"] >= 5_000_000, timeout=30)
            assert vision()["quota_bytes"] == 2**30 // 1000
            a2 = p.submit(alice, command=["true"])["id"]
            stays(p, a2, "StorageQuota")
            b1 = p.submit(bob, command=["true"])["id"]  # another team: untouched
            assert p.wait(b1, ("COMPLETED", "FAILED"), timeout=60)["state"] == "COMPLETED"
            # The running job is warned, once, however many measurements pass; it runs on.
            assert kinds(p, a1).count("job.storage_quota") == 1 and p.job(a1)["state"] == "RUNNING"
            assert kinds(p).count("team.storage_quota") == 1
            # Its next attempt waits too.
            assert p.admin.post(f"/api/v1/jobs/{a1}/requeue").status_code == 200
            stays(p, a1, "StorageQuota")
            assert p.job(a2)["state"] == "PENDING"
            ballast.unlink()  # the member deletes the checkpoint (retention would do the same)
            assert p.wait(a2, ("COMPLETED", "FAILED"), timeout=60)["state"] == "COMPLETED"
            assert p.wait(a1, "RUNNING", timeout=60)["attempt"] == 2
            assert kinds(p).count("team.storage_quota_cleared") == 1
            assert kinds(p, a1).count("job.storage_quota") == 1
        finally:
            p.stop()


def test_job_dirs_on_their_own_file_system_fill_it_and_never_the_stores(acc):
    with shared_dir("ty-jobsfs-") as d, tmpfs(d / "jobsfs", 24) as fs:
        cfg = d / "cluster.yaml"
        cfg.write_text(config(acc, extra="storage: {interval: 0.2s, reserve_percent: 10}\n"))  # no quota at all
        p = Plane(d / "yard", config=cfg, run_as=None, allow_root_jobs=None, jobs_dir=fs)
        try:
            assert (p.cp.data_dir / "jobs").resolve() == fs
            alice, bob = p.as_user("alice", "member", "vision"), p.as_user("bob", "member", "nlp")
            a1 = p.submit(alice, command=["/bin/sh", "-c", FILL_ALL])["id"]
            p.wait(a1, "RUNNING")
            wait_until(lambda: "filled" in _log(p, a1), timeout=60)
            wait_until(lambda: p.admin.get("/api/v1/storage").json()["reserve_crossed"], timeout=30)
            # The store's disk is untouched: submissions are taken (before: 507 for every team)...
            r = bob.post("/api/v1/jobs", json={"command": ["true"], "workdir": str(d)})
            assert r.status_code == 201, r.text
            b1 = r.json()["id"]
            # ... and wait for the reserve rather than fail on a full disk.
            stays(p, b1, "DiskReserve")
            [low] = [e for e in p.admin.get("/api/v1/events", params={"limit": 10000}).json()["events"]
                     if e["kind"] == "plane.disk_reserve"]
            assert str(fs) in low["message"] or "jobs" in low["message"]
            p.admin.post(f"/api/v1/jobs/{a1}/cancel")
            p.wait(a1, "CANCELLED", timeout=30)
            (job_dir(p.cp.data_dir, a1) / "checkpoints" / "ballast").unlink()
            assert p.wait(b1, ("COMPLETED", "FAILED"), timeout=60)["state"] == "COMPLETED"
            assert "plane.disk_reserve_cleared" in kinds(p)
        finally:
            p.stop()


def _log(p: Plane, job: int) -> str:
    try:
        return (Path(job_dir(p.cp.data_dir, job)) / "logs" / "rank-0.log").read_text()
    except OSError:
        return ""
