"""The checkpoint tiers thread (control/lifecycle/checkpoint_tiers.py) on real files, a real store
and a path archive: what it records, moves (copied, verified, then removed from the fast tier),
deletes (an audit event each), what it refuses (a link, a FIFO, a file not its manifest's size),
and what it never touches (the newest step, a resuming attempt's fast tier). The fetch-back and
the whole job are in tests/scenarios/test_checkpoint_tiers.py; the S3 archive in
tests/staging/test_archive_io.py."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.plane import TWO_TEAMS, Plane, identity_config_text
from trainyard.contracts import JobDir
from trainyard.services import retention
from trainyard.spec.models import RetentionSpec
from trainyard.store.models import AttemptRow, CheckpointCopyRow, CheckpointKeepRow, EventRow, JobRow


def config(archive: Path, rules: str = "{keep_last: 2, keep_every: 5}") -> str:
    return TWO_TEAMS.read_text() + f"""
storage:
  archive: {{url: "{archive}", interval: 1h}}
  lifecycle:
    checkpoints: {rules}
"""


@pytest.fixture
def plane(tmp_path):
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(config(tmp_path / "archive"))
    p = Plane(tmp_path / "yard", config=cfg, start=False)
    yield p
    p.cp.stop()


def job_with_dir(p: Plane) -> tuple[int, JobDir]:
    jid = p.submit(team="vision", command=["true"], hold=True)["id"]
    with p.cp.store.session() as s:
        jd = JobDir.of(p.cp.data_dir, jid, s.get(JobRow, jid).dir_key)
    for d in ("logs", "checkpoints", "metrics"):
        (jd.root / d).mkdir(parents=True)
    return jid, jd


def commit(jd: JobDir, step: int, *, loss: float | None = None, size: int = 3000) -> dict[str, bytes]:
    """A committed step as the runtime writes it: files, then the manifest (COMMITTED) last."""
    d = jd.checkpoints / f"step-{step}"
    d.mkdir()
    files = {"__0_0.distcp": os.urandom(size), ".metadata": os.urandom(100), "rank-0.pt": os.urandom(50)}
    for name, data in files.items():
        (d / name).write_bytes(data)
    manifest = {"format": 1, "step": step, "world_size": 1, "time": 0.0,
                "files": {k: len(v) for k, v in files.items()}, "metrics": {} if loss is None else {"loss": loss}}
    (d / "COMMITTED").write_text(json.dumps(manifest))
    return files


def rows(p: Plane, jid: int) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {"fast": set(), "archive": set()}
    with p.cp.store.session() as s:
        for r in s.query(CheckpointCopyRow).filter_by(job_id=jid):
            out[r.tier].add(r.step)
    return out


def on_disk(jd: JobDir) -> set[int]:
    return {int(x.name[5:]) for x in jd.checkpoints.iterdir() if x.name.startswith("step-")}


def events(p: Plane, kind: str) -> list[EventRow]:
    with p.cp.store.session() as s:
        return list(s.query(EventRow).filter_by(kind=kind).order_by(EventRow.id))


def end(p: Plane, jid: int) -> None:
    with p.cp.store.session.begin() as s:
        j = s.get(JobRow, jid)
        j.state, j.end_time, j.held = "COMPLETED", time.time() - 10, False


def running(p: Plane, jid: int, started_at: float) -> None:
    with p.cp.store.session.begin() as s:
        j = s.get(JobRow, jid)
        j.state, j.held, j.attempt = "RUNNING", False, 1
        s.add(AttemptRow(job_id=jid, attempt=1, started_at=started_at, placement=[], state="RUNNING"))


def test_ten_checkpoints_keep_last_2_every_5th_archived(plane, tmp_path):
    jid, jd = job_with_dir(plane)
    written = {n: commit(jd, n, loss=10.0 - n) for n in range(1, 11)}
    end(plane, jid)
    plane.cp.checkpoint_tiers.run_once()
    assert on_disk(jd) == {9, 10}
    assert rows(plane, jid) == {"fast": {9, 10}, "archive": {5}}
    arch = next((tmp_path / "archive").iterdir())
    assert arch.name.startswith(f"job-{jid}")
    step5 = arch / "step-5"
    for name, data in written[5].items():  # byte for byte, the marker and the sums beside them
        assert (step5 / name).read_bytes() == data
    sums = json.loads((step5 / "SHA256SUMS").read_text())
    assert sums == {k: hashlib.sha256(v).hexdigest() for k, v in written[5].items()}
    assert json.loads((step5 / "COMMITTED").read_text())["metrics"] == {"loss": 5.0}
    deleted = events(plane, "checkpoint.deleted")
    assert sorted(e.data["step"] for e in deleted) == [1, 2, 3, 4, 6, 7, 8]  # one event per deletion
    assert all(e.job_id == jid and e.data["tier"] == "fast" and e.data["bytes"] == 3150 and "keep_last: 2" in e.data["rule"]
               for e in deleted)
    assert [e.data["step"] for e in events(plane, "checkpoint.archived")] == [5]
    plane.cp.checkpoint_tiers.run_once()  # a second round changes nothing
    assert rows(plane, jid) == {"fast": {9, 10}, "archive": {5}} and len(events(plane, "checkpoint.deleted")) == 7


def test_a_marked_step_stays_fast_and_keep_for_leaves_only_it(plane, tmp_path):
    jid, jd = job_with_dir(plane)
    running(plane, jid, started_at=1.0)
    for n in range(1, 3):
        commit(jd, n)
    plane.cp.checkpoint_tiers.run_once()
    r = plane.admin.post(f"/api/v1/jobs/{jid}/checkpoints/2/keep")
    assert r.status_code == 200 and r.json()["keep"] is True
    assert plane.admin.post(f"/api/v1/jobs/{jid}/checkpoints/99/keep").status_code == 404
    for n in range(3, 5):
        commit(jd, n)
    plane.cp.checkpoint_tiers.run_once()
    assert on_disk(jd) == {2, 3, 4}  # 1: neither among the newest 2 nor a 5th
    listing = plane.admin.get(f"/api/v1/jobs/{jid}/checkpoints").json()["checkpoints"]
    assert [(c["step"], c["tiers"], c["keep"]) for c in listing] == [(2, ["fast"], True), (3, ["fast"], False),
                                                                     (4, ["fast"], False)]
    cfg = tmp_path / "keep_for.yaml"
    cfg.write_text(config(tmp_path / "archive", "{keep_last: 2, keep_for: 1}"))
    r = plane.admin.post("/api/v1/cluster/config", json={"text": identity_config_text(cfg)})
    assert r.status_code in (200, 201), r.text
    end(plane, jid)
    plane.cp.checkpoint_tiers.run_once()
    assert on_disk(jd) == {2}
    deleted = events(plane, "checkpoint.deleted")
    assert [(e.data["step"], "keep_for" in e.data["rule"]) for e in deleted] == [(1, False), (3, True), (4, True)]


def test_the_newest_step_and_a_resuming_attempts_fast_tier_are_never_removed(plane):
    jid, jd = job_with_dir(plane)
    for n in range(1, 8):
        commit(jd, n)
    running(plane, jid, started_at=4e9)  # an attempt that started after the newest commit: resuming
    plane.cp.checkpoint_tiers.run_once()
    assert on_disk(jd) == set(range(1, 8)) and not events(plane, "checkpoint.deleted")
    assert rows(plane, jid)["archive"] == {5}  # copied meanwhile: a copy takes nothing from the job
    with plane.cp.store.session.begin() as s:  # it committed since it started: the rules apply
        s.query(AttemptRow).filter_by(job_id=jid).one().started_at = 1.0
    plane.cp.checkpoint_tiers.run_once()
    assert on_disk(jd) == {6, 7} and rows(plane, jid) == {"fast": {6, 7}, "archive": {5}}


def test_links_fifos_and_lying_manifests_are_refused_and_nothing_is_lost(plane, tmp_path):
    jid, jd = job_with_dir(plane)
    secret = tmp_path / "secret"
    secret.write_bytes(b"root's own" * 100)
    for n in range(1, 11):
        commit(jd, n)
    (jd.checkpoints / "step-5" / "rank-0.pt").unlink()  # step 5's file is a link to a file of root's
    (jd.checkpoints / "step-5" / "rank-0.pt").symlink_to(secret)
    os.unlink(jd.checkpoints / "step-10" / ".metadata")  # a FIFO would hang a plain open()
    os.mkfifo(jd.checkpoints / "step-10" / ".metadata")
    end(plane, jid)
    plane.cp.checkpoint_tiers.run_once()
    assert rows(plane, jid)["archive"] == set()  # step 5 refused: its fast copy stays
    assert 5 in on_disk(jd) and not any(b"root's own" in p.read_bytes() for p in (tmp_path / "archive").rglob("*")
                                       if p.is_file())
    # a file longer than its manifest says is refused too
    (jd.checkpoints / "step-5" / "rank-0.pt").unlink()
    (jd.checkpoints / "step-5" / "rank-0.pt").write_bytes(os.urandom(51))
    plane.cp.checkpoint_tiers.run_once()
    assert rows(plane, jid)["archive"] == set() and 5 in on_disk(jd)
    (jd.checkpoints / "step-5" / "rank-0.pt").write_bytes(os.urandom(50))
    plane.cp.checkpoint_tiers.run_once()
    assert rows(plane, jid)["archive"] == {5} and 5 not in on_disk(jd)


def test_without_rules_the_plane_only_records(tmp_path):
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(TWO_TEAMS.read_text())
    p = Plane(tmp_path / "yard", config=cfg, start=False)
    try:
        jid, jd = job_with_dir(p)
        running(p, jid, started_at=1.0)
        for n in range(1, 6):
            commit(jd, n, loss=float(n))
        p.cp.checkpoint_tiers.run_once()
        assert on_disk(jd) == set(range(1, 6)) and rows(p, jid)["fast"] == set(range(1, 6))
        listing = p.admin.get(f"/api/v1/jobs/{jid}/checkpoints").json()["checkpoints"]
        assert listing[0]["metrics"] == {"loss": 1.0} and listing[0]["bytes"] == 3150
    finally:
        p.cp.stop()


def ended_with_step_5_archived(p: Plane) -> int:
    """A finished job whose 10 steps the rules have tended: 9 and 10 fast, 5 archived."""
    jid, jd = job_with_dir(p)
    for n in range(1, 11):
        commit(jd, n)
    end(p, jid)
    p.cp.checkpoint_tiers.run_once()
    return jid


def purge(p: Plane) -> Any:
    """`retention.jobs: 1s` once: the real purge of the finished jobs' records."""
    with p.cp.lock, p.cp.store.session.begin() as s:
        return retention.purge_jobs(s, p.cp.data_dir, RetentionSpec(jobs=1), time.time())


def test_a_purged_jobs_archive_copies_and_marks_go_with_it(plane, tmp_path):
    jid = ended_with_step_5_archived(plane)
    assert plane.admin.post(f"/api/v1/jobs/{jid}/checkpoints/10/keep").status_code == 200
    archived = next((tmp_path / "archive").iterdir()) / "step-5"
    assert (archived / "COMMITTED").is_file()
    out = purge(plane)
    retention.remove(out.dirs)
    assert out.jobs == 1 and rows(plane, jid) == {"fast": {9, 10}, "archive": {5}}  # not yet: the thread's
    plane.cp.checkpoint_tiers.run_once()
    assert not archived.exists() and rows(plane, jid) == {"fast": set(), "archive": set()}
    with plane.cp.store.session() as s:
        assert s.query(CheckpointKeepRow).filter_by(job_id=jid).count() == 0  # the mark went with its job
    [gone] = [e for e in events(plane, "checkpoint.deleted") if e.data["rule"] == "retention.jobs"]
    assert (gone.job_id, gone.data["step"], gone.data["tier"]) == (jid, 5, "archive")
    assert gone.data["bytes"] > 3150  # the step's files, its SHA256SUMS and marker: what the archive held


def test_a_purged_jobs_copy_outside_the_configured_archive_is_kept_not_forgotten(plane, tmp_path):
    jid = ended_with_step_5_archived(plane)
    cfg = tmp_path / "moved.yaml"  # the archive moved elsewhere since step 5 was copied
    cfg.write_text(config(tmp_path / "archive2"))
    assert plane.admin.post("/api/v1/cluster/config", json={"text": identity_config_text(cfg)}).status_code in (200, 201)
    purge(plane)
    plane.cp.checkpoint_tiers.run_once()
    assert rows(plane, jid)["archive"] == {5}
    assert (next((tmp_path / "archive").iterdir()) / "step-5" / "COMMITTED").is_file()


def test_the_thread_keeps_its_archive_client_while_the_configuration_names_the_same_archive(plane, tmp_path):
    t = plane.cp.checkpoint_tiers
    t.run_once()
    first = t._current_archive
    t.run_once()
    assert first is not None and t._current_archive is first  # one client over rounds, not one per round
    cfg = tmp_path / "moved.yaml"
    cfg.write_text(config(tmp_path / "archive2"))
    assert plane.admin.post("/api/v1/cluster/config", json={"text": identity_config_text(cfg)}).status_code in (200, 201)
    t.run_once()
    assert t._current_archive is not first and t._current_archive.url == str(tmp_path / "archive2")
