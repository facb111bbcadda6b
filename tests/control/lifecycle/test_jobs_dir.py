"""Job dirs on another file system than the store's: `yard up --jobs-dir` (`<data dir>/jobs` a link,
`plane_files.use_jobs_dir`) or a mount an admin made at `<data dir>/jobs`. The plane and `jobfs`
reach every job dir through it: jobs run and write there, their logs are served, a restarted plane
re-attaches them and audits the dirs, and the storage meter measures that file system."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from tests.mounts import tmpfs
from tests.plane import TWO_TEAMS, Plane, job_dir, script, wait_until
from trainyard.control.lifecycle.plane_files import JobsDirError, jobs_dir_note, use_jobs_dir


def fast(tmp_path: Path) -> Path:
    """The test configuration, measured every 0.2 s."""
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(TWO_TEAMS.read_text() + "storage: {interval: 0.2s}\n")
    return cfg


def test_use_jobs_dir_makes_keeps_and_refuses_the_link(tmp_path):
    data, there = tmp_path / "data", tmp_path / "scratch" / "yard-jobs"
    data.mkdir()
    use_jobs_dir(data, there)
    assert os.readlink(data / "jobs") == str(there) and stat.S_IMODE(there.stat().st_mode) == 0o711
    use_jobs_dir(data, there)  # the same again: kept
    with pytest.raises(JobsDirError, match="already links to"):
        use_jobs_dir(data, tmp_path / "other")
    with pytest.raises(JobsDirError, match="absolute"):
        use_jobs_dir(data, type(there)("relative/jobs"))
    old = tmp_path / "old"
    (old / "jobs" / "7-0123456789ab").mkdir(parents=True)
    with pytest.raises(JobsDirError, match=r"holds job dirs; with the plane stopped, move them \(mv "):
        use_jobs_dir(old, there)
    assert (old / "jobs").is_dir() and not (old / "jobs").is_symlink()  # nothing moved, nothing lost
    (old / "jobs" / "7-0123456789ab").rmdir()
    use_jobs_dir(old, there)  # an empty one is replaced
    assert (old / "jobs").is_symlink()


def test_a_plane_whose_job_dirs_are_behind_a_link_runs_serves_re_attaches_and_audits(tmp_path):
    there = tmp_path / "scratch"
    p = Plane(tmp_path / "yard", config=fast(tmp_path), jobs_dir=there)
    try:
        jid = p.submit(team="vision", command=script(
            "import os, time; print('hello', flush=True); "
            "open(os.path.join(os.environ['TRAINYARD_CHECKPOINT_DIR'], 'ck'), 'wb').write(b'x' * 2**20); "
            "time.sleep(60)"))["id"]
        p.wait(jid, "RUNNING")
        jd = job_dir(p.cp.data_dir, jid)
        wait_until(lambda: b"hello" in p.admin.get(f"/api/v1/jobs/{jid}/logs").content)
        assert (there / jd.name / "logs" / "rank-0.log").is_file()
        wait_until(lambda: (p.job(jid)["disk"] or {}).get("bytes", 0) >= 2**20)
        assert "on the store's file system" in jobs_dir_note(p.cp.data_dir)
    finally:
        p.cp.stop()  # its job runs on
    (there / "99-aaaaaaaaaaaa").mkdir()  # a dir the store does not know
    again = Plane(tmp_path / "yard", config=fast(tmp_path))  # no --jobs-dir: the link stays
    try:
        assert any("99-aaaaaaaaaaaa" in f.message for f in again.cp.audit)
        assert again.job(jid)["state"] == "RUNNING"
        time.sleep(1)
        assert again.job(jid)["state"] == "RUNNING" and again.job(jid)["attempt"] == 1  # re-attached, not lost
    finally:
        again.stop()
    assert again.job(jid)["state"] == "CANCELLED"


def test_a_file_system_an_admin_mounted_at_jobs_is_used_and_measured(tmp_path):
    data = tmp_path / "yard"
    data.mkdir()
    with tmpfs(data / "jobs", 16):
        p = Plane(data, config=fast(tmp_path))
        try:
            fill = 'head -c 3000000 /dev/zero > "$TRAINYARD_CHECKPOINT_DIR/c"'
            jid = p.submit(team="nlp", command=["sh", "-c", fill])["id"]
            assert p.wait(jid, ("COMPLETED", "FAILED"))["state"] == "COMPLETED"
            assert os.stat(job_dir(data, jid)).st_dev != os.stat(data).st_dev
            assert "on another file system than the store's" in jobs_dir_note(p.cp.data_dir)
            wait_until(lambda: (p.job(jid)["disk"] or {}).get("bytes", 0) >= 3_000_000)
            rep = p.admin.get("/api/v1/storage").json()
            assert [f["path"] for f in rep["file_systems"]] == [str(p.cp.data_dir), str(p.cp.data_dir / "jobs")]
            assert rep["file_systems"][1]["size"] == 16 << 20
        finally:
            p.stop()
