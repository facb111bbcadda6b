"""/api/v1/jobs/{id}/checkpoints and its keep marks (api/routers/checkpoints.py,
services/checkpoint_copies.py): who may list and mark, bad input (4xx naming the field, nothing
written), the audit of a mark, and the archive location shown only to who manages the job."""

from __future__ import annotations

import pytest

from tests.plane import Plane
from trainyard.store.models import CheckpointCopyRow, CheckpointKeepRow, EventRow


@pytest.fixture
def plane(tmp_path):
    p = Plane(tmp_path / "yard", start=False)
    yield p
    p.cp.stop()


def job_with_steps(p: Plane) -> int:
    jid = p.submit(team="vision", command=["true"], hold=True)["id"]
    with p.cp.store.session.begin() as s:
        s.add(CheckpointCopyRow(job_id=jid, step=5, tier="archive", bytes=10, files=2, at=1.0,
                                location="s3://b/ckpt/job-1/step-5", metrics={"loss": 0.5}))
        s.add(CheckpointCopyRow(job_id=jid, step=10, tier="fast", bytes=10, files=2, at=2.0, metrics={"loss": 0.4}))
    return jid


def test_members_list_and_mark_their_teams_jobs_others_may_not(plane):
    jid = job_with_steps(plane)
    member = plane.as_user("ann", "member", "vision")
    other = plane.as_user("bob", "member", "nlp")
    viewer = plane.as_user("vic", "viewer")
    mine = member.get(f"/api/v1/jobs/{jid}/checkpoints").json()["checkpoints"]
    assert [(c["step"], c["tiers"], c["metrics"]) for c in mine] == [(5, ["archive"], {"loss": 0.5}),
                                                                   (10, ["fast"], {"loss": 0.4})]
    assert mine[0]["archive"] == "s3://b/ckpt/job-1/step-5"
    theirs = viewer.get(f"/api/v1/jobs/{jid}/checkpoints").json()["checkpoints"]
    assert "archive" not in theirs[0]  # where the archive is: for who manages the job
    r = other.post(f"/api/v1/jobs/{jid}/checkpoints/5/keep")
    assert r.status_code == 403 and "nlp" in r.json()["detail"]
    assert viewer.post(f"/api/v1/jobs/{jid}/checkpoints/5/keep").status_code == 403
    r = member.post(f"/api/v1/jobs/{jid}/checkpoints/5/keep")
    assert r.status_code == 200 and r.json() == {"job_id": jid, "step": 5, "keep": True}
    assert member.post(f"/api/v1/jobs/{jid}/checkpoints/5/keep").status_code == 200  # again: no change
    assert member.get(f"/api/v1/jobs/{jid}/checkpoints").json()["checkpoints"][0]["keep"] is True
    r = member.post(f"/api/v1/jobs/{jid}/checkpoints/5/keep", params={"undo": "true"})
    assert r.status_code == 200 and r.json()["keep"] is False
    with plane.cp.store.session() as s:
        kinds = [e.kind for e in s.query(EventRow).filter_by(job_id=jid)]
        assert kinds.count("checkpoint.kept") == 1 and kinds.count("checkpoint.unkept") == 1
        assert s.query(CheckpointKeepRow).count() == 0


def test_bad_input_is_refused_and_writes_nothing(plane):
    jid = job_with_steps(plane)
    assert plane.admin.post(f"/api/v1/jobs/{jid}/checkpoints/-1/keep").status_code == 422
    assert plane.admin.post(f"/api/v1/jobs/{jid}/checkpoints/abc/keep").status_code == 422
    r = plane.admin.post(f"/api/v1/jobs/{jid}/checkpoints/7/keep")
    assert r.status_code == 404 and "no committed checkpoint step 7" in r.json()["detail"]
    assert plane.admin.get("/api/v1/jobs/999/checkpoints").status_code == 404
    assert plane.admin.post("/api/v1/jobs/999/checkpoints/5/keep").status_code == 404
    with plane.cp.store.session() as s:
        assert s.query(CheckpointKeepRow).count() == 0
