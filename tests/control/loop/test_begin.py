"""`--begin` on a real plane: a job is not scheduled before its start time, waits with the reason
BeginTime meanwhile, and counts its wait from then; bad times are refused naming the field."""

from __future__ import annotations

import time

from tests.plane import Plane, script


def test_a_job_starts_no_earlier_than_its_begin_time(plane: Plane):
    begin = time.time() + 6.0
    j = plane.submit(command=script("pass"), team="vision", begin=begin)
    assert j["state"] == "PENDING" and j["reason"] == "BeginTime"
    assert j["begin_time"] == begin and j["eligible_time"] == begin  # Slurm's EligibleTime is the begin time
    now_job = plane.submit(command=script("pass"), team="vision", begin="now")  # a string, read by the server
    assert now_job["begin_time"] is None and now_job["reason"] == "None"
    plane.wait(now_job["id"], "COMPLETED")
    seen = plane.job(j["id"])
    if time.time() < begin:  # on a loaded machine the other job may take past the begin time
        assert seen["state"] == "PENDING"  # free GPUs, but not yet its time
    done = plane.wait(j["id"], "COMPLETED")
    assert done["start_time"] >= begin


def test_a_begin_time_after_a_dependency_or_a_hold_still_holds(plane: Plane):
    gate = plane.cp.data_dir / "gate"
    first = plane.submit(command=script(f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)"),
                         team="vision")
    later = time.time() + 3600
    dep = plane.submit(command=script("pass"), team="vision", dependency=f"afterany:{first['id']}", begin=later)
    held = plane.submit(command=script("pass"), team="vision", hold=True, begin=later)
    assert (dep["reason"], held["reason"]) == ("Dependency", "JobHeldUser")
    assert plane.admin.post(f"/api/v1/jobs/{held['id']}/release").json()["reason"] == "BeginTime"
    gate.touch()
    plane.wait(first["id"], "COMPLETED")
    plane.wait(dep["id"], lambda j: j["reason"] == "BeginTime")
    assert plane.job(dep["id"])["eligible_time"] == later and plane.job(dep["id"])["state"] == "PENDING"


def test_bad_begin_times_are_refused_naming_the_field(plane: Plane):
    before = plane.admin.get("/api/v1/jobs").json()["jobs"]
    for begin in ("next tuesday", "25:00", 1e300, -5, True, float("nan")):
        r = plane.admin.post("/api/v1/jobs", json=dict(command=["true"], team="vision", begin=begin,
                                                         workdir=str(plane.cp.data_dir))) \
            if begin == begin else plane.admin.post("/api/v1/jobs", content=b'{"command": ["true"], "begin": NaN}',
                                                    headers={"content-type": "application/json"})
        assert r.status_code in (400, 422), (begin, r.text)
        assert "begin" in r.text, (begin, r.text)
    assert plane.admin.get("/api/v1/jobs").json()["jobs"] == before
