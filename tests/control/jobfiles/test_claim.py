"""A job's directory is claimed at its first launch and refused when it was not made by the job:
`control/jobfiles/claim.py` on a real file system, and through a real plane (the launch holds the job)."""

from __future__ import annotations

import os

import pytest

from tests.plane import Plane, script
from trainyard.contracts import JobDir
from trainyard.control.jobfiles import claim as job_dirs


def test_claim_makes_the_directory_with_its_owner_and_finds_it_again(tmp_path):
    jd = JobDir.of(tmp_path, 7, "0123456789ab")
    assert jd.root.name == "7-0123456789ab" and JobDir.parse_name(jd.root.name) == (7, "0123456789ab")
    owner = job_dirs.owner_record("store-a", 7, "0123456789ab")
    job_dirs.claim(jd, owner)
    assert job_dirs.read_owner(jd) == owner and jd.logs.is_dir() and jd.checkpoints.is_dir()
    (jd.logs / "rank-0.log").write_text("attempt 1\n")
    job_dirs.claim(jd, owner)  # the next attempt: the same directory, its logs kept
    assert (jd.logs / "rank-0.log").read_text() == "attempt 1\n"
    assert [p.name for p in (tmp_path / "jobs").iterdir()] == [jd.root.name]  # no temporary left


@pytest.mark.parametrize("found, says", [
    ({"store": "store-a", "job_id": 7, "key": "ffffffffffff"}, "belongs to job 7 (key ffffffffffff) of this store"),
    ({"store": "store-b", "job_id": 7, "key": "0123456789ab"}, "of another store (store-b)"),
    (None, "has no .trainyard-job"),
])
def test_claim_refuses_a_directory_another_job_or_store_made(tmp_path, found, says):
    jd = JobDir.of(tmp_path, 7, "0123456789ab")
    jd.logs.mkdir(parents=True)
    (jd.logs / "rank-0.log").write_text("someone else's output\n")
    if found is not None:
        jd.owner_file.write_text(__import__("json").dumps(found))
    with pytest.raises(job_dirs.ForeignJobDir, match=says.replace("(", r"\(").replace(")", r"\)")):
        job_dirs.claim(jd, job_dirs.owner_record("store-a", 7, "0123456789ab"))
    assert (jd.logs / "rank-0.log").read_text() == "someone else's output\n"  # untouched


def test_a_job_from_before_keys_adopts_its_unmarked_directory_only_when_asked(tmp_path):
    jd = JobDir.of(tmp_path, 3)  # jobs/3: the layout of a job stored before directory keys
    jd.checkpoints.mkdir(parents=True)
    owner = job_dirs.owner_record("store-a", 3, None)
    with pytest.raises(job_dirs.ForeignJobDir):
        job_dirs.claim(jd, owner)
    job_dirs.claim(jd, owner, adopt_unmarked=True)
    assert job_dirs.read_owner(jd) == owner


def test_claim_refuses_a_symbolic_link_in_place_of_the_directory(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    jd = JobDir.of(tmp_path, 9, "aaaaaaaaaaaa")
    jd.root.parent.mkdir(parents=True)
    os.symlink(elsewhere, jd.root)
    with pytest.raises(job_dirs.ForeignJobDir, match="symbolic link"):
        job_dirs.claim(jd, job_dirs.owner_record("s", 9, "aaaaaaaaaaaa"))
    assert list(elsewhere.iterdir()) == []


def test_a_launch_into_a_directory_the_job_did_not_make_holds_the_job_for_an_admin(tmp_path):
    p = Plane(tmp_path / "d")
    try:
        job = p.submit(command=script("print('the new job ran')"), team="vision", hold=True)
        where = p.job(job["id"])["job_dir"]
        assert where.startswith(str(p.cp.data_dir / "jobs" / f"{job['id']}-"))
        jd = JobDir(where)
        jd.logs.mkdir(parents=True)  # as if left by another store's job
        (jd.logs / "rank-0.log").write_text("old output\n")
        assert p.admin.post(f"/api/v1/jobs/{job['id']}/release").status_code == 200
        held = p.wait(job["id"], lambda j: j["held"] and j["attempt"] == 1)
        assert held["state"] == "REQUEUED" and held["reason"] == "launch failed requeued held"
        assert held["attempts"][0]["reason"].startswith(f"launch refused: {where} exists but was not made by job")
        events = p.admin.get(f"/api/v1/jobs/{job['id']}/events").json()["events"]
        assert any(e["kind"] == "job.launch_refused" and "moves the directory aside" in e["message"] for e in events)
        assert (jd.logs / "rank-0.log").read_text() == "old output\n"
        member = p.as_user("vera", "member", "vision")
        r = member.post(f"/api/v1/jobs/{job['id']}/release")
        assert r.status_code == 403 and "launch failed requeued held" in r.json()["detail"]
        os.rename(jd.root, tmp_path / "moved-aside")  # what the admin does, then releases it
        assert p.admin.post(f"/api/v1/jobs/{job['id']}/release").status_code == 200
        p.wait(job["id"], "COMPLETED")
        assert "the new job ran" in p.admin.get(f"/api/v1/jobs/{job['id']}/logs").text
    finally:
        p.stop()
