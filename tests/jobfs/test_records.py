"""The plane's side of the checkpoint contract (`jobfs.records`): a `step-N/` counts only as a
real directory with a regular `COMMITTED` in it, and asking for the newest costs a listing and a
few looks, however many directories a job made."""

from __future__ import annotations

import os

from trainyard import jobfs


def _job(tmp_path):
    root = tmp_path / "job"
    (root / "checkpoints").mkdir(parents=True)
    return jobfs.Tree(root)


def test_committed_steps_ignores_links_and_marker_links(tmp_path):
    job = _job(tmp_path)
    ck = job.root / "checkpoints"
    (ck / "step-10").mkdir()
    (ck / "step-10" / "COMMITTED").write_text("")
    (ck / "step-20").mkdir()
    (ck / "step-20" / "COMMITTED").symlink_to("/etc/hostname")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "COMMITTED").parent.mkdir()
    (elsewhere / "COMMITTED").write_text("")
    (ck / "step-30").symlink_to(elsewhere)
    assert [s for s, _ in jobfs.committed_steps(job, ck)] == [10]
    assert jobfs.newest_checkpoint(job, "checkpoints")[0] == 10


def test_the_newest_is_looked_for_among_the_newest_step_dirs_only(tmp_path):
    """A job that makes thousands of step dirs without a marker: the loop asks every pass, so only
    the newest NEWEST_TRIES are looked into; the listing itself stats nothing."""
    job = _job(tmp_path)
    ck = job.root / "checkpoints"
    for n in (5, 10_000):
        (ck / f"step-{n}").mkdir()
        (ck / f"step-{n}" / "COMMITTED").touch()
    for n in range(10, 2010):
        (ck / f"step-{n}").mkdir()  # uncommitted (a save in progress, or a hostile job's)
    os.mkfifo(ck / "step-20000")  # not a directory: no step
    assert jobfs.newest_checkpoint(job, "checkpoints")[0] == 10_000
    (ck / "step-10000" / "COMMITTED").unlink()
    assert jobfs.newest_checkpoint(job, "checkpoints") is None  # step 5 lies behind 2,000 newer dirs
    assert [s for s, _ in jobfs.committed_steps(job, ck)] == [5]  # asked for all: all are looked into
    assert jobfs.commit_time(job, ck, 5) is not None and jobfs.commit_time(job, ck, 11) is None
