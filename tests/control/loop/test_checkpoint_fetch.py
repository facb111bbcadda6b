"""The fetch-back of an archived checkpoint before a resume (control/loop/checkpoint_fetch.py) when
the archive cannot give it, on the fake backend and a fake clock: the archive's fault, under the one
rule of a failed start step (control/loop/start_failure.py), back in the queue after a pause, not
counted against the job's retries, and failed after 5 in a row rather than requeued for ever. The
fetch that succeeds: tests/scenarios/test_checkpoint_tiers.py."""

from __future__ import annotations

from tests.fake_plane import FakePlane, fake
from tests.plane import TWO_TEAMS
from trainyard.services import checkpoint_copies as copies


def test_an_archive_that_cannot_give_the_step_requeues_then_fails_after_five_in_a_row(tmp_path):
    archive = tmp_path / "archive"
    config = tmp_path / "c.yaml"
    config.write_text(TWO_TEAMS.read_text() + f'storage:\n  archive: {{url: "{archive}", interval: 1h}}\n')
    p = FakePlane(tmp_path / "plane", config=config)
    try:
        job = p.submit(name="resume", team="vision", gpus=8, command=fake("run=5"), hold=True)["id"]
        with p.cp.lock, p.cp.store.session.begin() as s:  # the archive's record of a step whose files are gone
            copies.put(s, job, 100, "archive", nbytes=10, files=1, at=1.0, location=f"{archive}/job-{job}/step-100")
        assert p.admin.post(f"/api/v1/jobs/{job}/release").status_code == 200
        j = p.wait(job, "REQUEUED")
        assert j["reason"] == "CheckpointFetchError"
        requeued = [e for e in p.events(job) if e["kind"] == "job.requeued"]
        assert "the archive's fault (1 in a row)" in requeued[0]["message"]
        assert "not counted against its retries" in requeued[0]["message"]
        j = p.wait(job, "FAILED", timeout=3000)
        assert len(j["attempts"]) == 5 and j["reason"].startswith("CheckpointFetchError: step 100:"), j["reason"]
    finally:
        p.stop()
