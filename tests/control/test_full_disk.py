"""A full data disk loses nothing: a job that exits 0 while the disk is full ends COMPLETED exactly
once (its exit record lands in space the rank runner reserved; it is not judged lost and run
again), and submissions on the full disk get a 507 naming the disk, storing nothing.
Real plane, real processes, a real (small) tmpfs filled to the last byte."""

from __future__ import annotations

import os
import time

from tests.mounts import fill, tmpfs
from tests.plane import Plane, script
from trainyard.store.models import AttemptRow, JobRow

FILL_AND_EXIT_0 = """
import os, sys
path = os.path.join(sys.argv[1], "ballast-job")
with open(path, "wb", buffering=0) as f:
    chunk = b"x" * 65536
    try:
        while True:
            f.write(chunk)
    except OSError:
        pass
try:
    with open(path + "-tail", "wb", buffering=0) as g:  # the last bytes, smaller than a chunk
        while True:
            g.write(b"x" * 512)
except OSError:
    pass
print("disk filled, exiting 0", flush=True)
"""


def free(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_job_that_exits_0_on_a_full_disk_completes_exactly_once(tmp_path):
    with tmpfs(tmp_path / "fs", 64) as fs:
        p = Plane(fs / "yard")
        try:
            jid = p.submit(team="vision", command=[*script(FILL_AND_EXIT_0), str(fs)])["id"]
            deadline = time.monotonic() + 60
            while not (fs / "ballast-job-tail").exists():
                assert time.monotonic() < deadline, f"the job did not fill the disk: {p.job(jid)}"
                time.sleep(0.1)
            # The disk is full and the job is exiting 0: for a while nothing may judge it lost.
            assert free(fs) < 64 * 1024
            time.sleep(3)
            with p.cp.store.session() as s:
                row = s.get(JobRow, jid)
                attempts = s.query(AttemptRow).filter_by(job_id=jid).count()
            assert row.state in ("RUNNING", "COMPLETING", "COMPLETED") and attempts == 1, (row.state, row.reason)
            for f in ("ballast-job", "ballast-job-tail"):
                (fs / f).unlink()
            j = p.wait(jid, ("COMPLETED", "FAILED", "NODE_FAIL", "REQUEUED"), timeout=60)
            assert j["state"] == "COMPLETED" and len(j["attempts"]) == 1, j
            assert j["attempts"][0]["exit_code"] == 0
        finally:
            p.cp.stop()


def test_submissions_on_a_full_disk_get_507_and_store_nothing(tmp_path):
    with tmpfs(tmp_path / "fs", 48) as fs:
        p = Plane(fs / "yard", start=False)
        try:
            ballast = fill(fs, 0)
            accepted, refused = 0, None
            for i in range(3000):
                r = p.admin.post("/api/v1/jobs", json={"command": ["true"], "team": "vision", "hold": True,
                                                       "workdir": str(fs), "name": f"j{i}", "env": {"PAD": "x" * 2000}})
                if r.status_code == 201:
                    accepted += 1
                    continue
                refused = r
                break
            assert refused is not None, "3000 submissions fit on a full disk?"
            assert refused.status_code == 507, refused.text
            assert "data disk is full" in refused.json()["detail"] and str(p.cp.data_dir) in refused.json()["detail"]
            ballast.unlink()
            listed = p.admin.get("/api/v1/jobs", params={"state": "all"}).json()["jobs"]
            assert len(listed) == accepted  # the refused one left nothing behind
        finally:
            p.cp.stop()
