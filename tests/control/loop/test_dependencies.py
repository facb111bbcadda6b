"""`--dependency` on a real plane (store, loop, local backend, real rank processes): a pipeline
runs stage after stage, a stage whose dependency can never hold is cancelled with its own
dependents, and what cannot be met at submission is refused, writing nothing."""

from __future__ import annotations

from tests.plane import Plane, script


def events(p: Plane, jid: int) -> list[str]:
    return [e["kind"] for e in p.admin.get("/api/v1/events", params={"job": jid}).json()["events"]]


def test_a_pipeline_runs_in_order_and_a_failed_stage_cancels_what_needed_it(plane: Plane):
    gate = plane.cp.data_dir / "gate"
    first = plane.submit(command=script(f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)"),
                         team="vision")
    ok = plane.submit(command=script("pass"), team="vision", dependency=f"afterok:{first['id']}")
    after_started = plane.submit(command=script("pass"), team="nlp", dependency=f"after:{first['id']}")
    bad = plane.submit(command=script("raise SystemExit(3)"), team="nlp", dependency=f"afterany:{first['id']}")
    needs_bad = plane.submit(command=script("pass"), team="nlp", dependency=f"afterok:{bad['id']}")
    needs_that = plane.submit(command=script("pass"), team="nlp", dependency=f"afterany:{needs_bad['id']}")
    chained = plane.submit(command=script("pass"), team="nlp", dependency=f"afterok:{needs_bad['id']}")
    cleanup = plane.submit(command=script("pass"), team="nlp", dependency=f"afternotok:{bad['id']}")
    assert ok["state"] == "PENDING" and ok["reason"] == "Dependency" and ok["dependency"] == f"afterok:{first['id']}"

    plane.wait(first["id"], "RUNNING")
    plane.wait(after_started["id"], "COMPLETED")  # `after`: the first job has started, not ended
    assert plane.job(ok["id"])["reason"] == "Dependency" and plane.job(ok["id"])["state"] == "PENDING"
    assert plane.job(bad["id"])["state"] == "PENDING"  # 4 free GPUs, but it waits for the first job's end
    gate.touch()
    done = plane.wait(first["id"], "COMPLETED")
    second = plane.wait(ok["id"], "COMPLETED")
    assert second["start_time"] >= done["end_time"]
    # its wait against the class's max_wait counts from then (Slurm's EligibleTime), not from its submission
    assert second["eligible_time"] >= done["end_time"] > second["submit_time"]
    assert done["eligible_time"] == done["submit_time"]
    assert "job.dependency_met" in events(plane, ok["id"])

    plane.wait(bad["id"], "FAILED", timeout=60)
    gone = plane.wait(needs_bad["id"], "CANCELLED")
    assert gone["reason"] == "DependencyNeverSatisfied" and gone["start_time"] is None
    ev = plane.admin.get("/api/v1/events", params={"job": needs_bad["id"]}).json()["events"]
    assert any(e["kind"] == "job.cancelled" and f"job {bad['id']} is FAILED" in e["message"] for e in ev)
    assert plane.wait(chained["id"], "CANCELLED")["reason"] == "DependencyNeverSatisfied"  # the cascade
    # `afterany` on a job that never ran is met, so this one runs (a cascade needs afterok to stop it)
    plane.wait(needs_that["id"], "COMPLETED")
    plane.wait(cleanup["id"], "COMPLETED")  # afternotok: the failure handler runs


def test_singleton_runs_one_job_of_a_name_and_user_at_a_time(plane: Plane):
    gate = plane.cp.data_dir / "gate"
    body = dict(command=script(f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)"),
                team="vision", name="nightly-eval")
    a = plane.submit(**body)
    b = plane.submit(**body, dependency="singleton")
    other = plane.submit(**{**body, "name": "other"}, dependency="singleton")  # another name: free to run
    plane.wait(a["id"], "RUNNING")
    plane.wait(other["id"], "RUNNING")
    assert plane.job(b["id"])["state"] == "PENDING" and plane.job(b["id"])["reason"] == "Dependency"
    gate.touch()
    plane.wait(a["id"], "COMPLETED")
    plane.wait(b["id"], "COMPLETED")


def test_a_held_job_keeps_waiting_on_its_dependency_when_released(plane: Plane):
    gate = plane.cp.data_dir / "gate"
    first = plane.submit(command=script(f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)"),
                         team="vision")
    then = plane.submit(command=script("pass"), team="vision", hold=True, dependency=f"afterok:{first['id']}")
    assert then["reason"] == "JobHeldUser" and then["eligible_time"] is None
    assert plane.admin.post(f"/api/v1/jobs/{then['id']}/release").status_code == 200
    assert plane.job(then["id"])["reason"] == "Dependency" and plane.job(then["id"])["eligible_time"] is None
    plane.wait(first["id"], "RUNNING")
    assert plane.job(then["id"])["state"] == "PENDING"
    gate.touch()
    assert plane.wait(then["id"], "COMPLETED")["eligible_time"] >= plane.job(first["id"])["end_time"]
    held = plane.submit(command=script("pass"), team="vision", hold=True)
    assert plane.admin.post(f"/api/v1/jobs/{held['id']}/release").status_code == 200
    assert plane.wait(held["id"], "COMPLETED")["eligible_time"] > held["submit_time"]  # released: eligible from then


def test_what_can_never_be_met_is_refused_at_submission_and_nothing_is_written(plane: Plane):
    failed = plane.submit(command=script("raise SystemExit(1)"), team="vision", **{"class": "batch"})
    plane.wait(failed["id"], "FAILED", timeout=60)
    before = plane.admin.get("/api/v1/jobs").json()["jobs"]
    for dep, status, words in ((f"afterok:{failed['id']}", 400, f"job {failed['id']} is FAILED"),
                               ("afterany:999", 400, "no job 999"),
                               (f"afternotok:{failed['id']}:999", 400, "no job 999"),
                               ("afterok:1?afterok:2", 422, "not supported"),
                               ("afterevery:1", 422, "unknown dependency kind")):
        r = plane.admin.post("/api/v1/jobs", json=dict(command=["true"], team="vision", dependency=dep,
                                                         workdir=str(plane.cp.data_dir)))
        assert r.status_code == status, (dep, r.text)
        body = r.json()
        field, message = (body["detail"][0]["loc"][-1], body["detail"][0]["msg"]) if status == 422 else \
            (body["field"], body["detail"])
        assert field == "dependency" and words in message, (dep, r.text)
    assert plane.admin.get("/api/v1/jobs").json()["jobs"] == before
