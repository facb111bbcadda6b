"""`yard acct`'s image and digest (issue 37): a job's record names its image and the digest its
first attempt pinned, each attempt the digest it ran; a bare job has neither. On SQLite and
PostgreSQL, through the real API (the store written by hand: tests/services/acct_history.py)."""

from __future__ import annotations

from sqlalchemy import update

from tests.plane import Plane
from tests.services.acct_history import T0, Try, add_job
from trainyard.spec.container import ContainerOptions
from trainyard.store.models import AttemptRow

H = 3600.0
DIGEST = "sha256:" + "c0ffee" * 10 + "c0ff"


def test_job_and_attempt_records_name_the_image_and_digest(acct_plane: Plane) -> None:
    p = acct_plane
    record = ContainerOptions(image="nvcr.io/nvidia/pytorch:24.01-py3").to_record()
    boxed = add_job(p, tries=(Try(0.5 * H, 1.5 * H, state="PREEMPTED", cause="preempted"), Try(2 * H, 2.5 * H)),
                    container=record, image_digest=DIGEST)
    bare = add_job(p, tries=(Try(H, 2 * H),))
    with p.cp.store.session.begin() as s:
        s.execute(update(AttemptRow).where(AttemptRow.job_id == boxed).values(image_digest=DIGEST))
    window = {"starttime": f"@{T0}", "endtime": f"@{T0 + 3 * H}"}
    jobs = {j["id"]: j for j in p.admin.get("/api/v1/acct/jobs", params=window).json()["jobs"]}
    assert (jobs[boxed]["image"], jobs[boxed]["image_digest"]) == ("nvcr.io/nvidia/pytorch:24.01-py3", DIGEST)
    assert (jobs[bare]["image"], jobs[bare]["image_digest"]) == (None, None)
    tries = p.admin.get("/api/v1/acct/attempts", params=window).json()["attempts"]
    assert [(a["job_id"], a["image"], a["image_digest"]) for a in tries] == [
        (boxed, "nvcr.io/nvidia/pytorch:24.01-py3", DIGEST), (boxed, "nvcr.io/nvidia/pytorch:24.01-py3", DIGEST),
        (bare, None, None)]
