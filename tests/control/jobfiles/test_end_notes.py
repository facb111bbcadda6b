"""A job's log ends with what ended it, in Slurm's words (issue 35 point 6): `control/jobfiles/end_notes.py`
on its own, and through a real plane for a plain job that is cancelled, times out, fails and is
told by its exit code."""

from __future__ import annotations

import re

import pytest

from tests.plane import Plane, job_dir
from trainyard.backends.base import RankState
from trainyard.control.jobfiles.end_notes import lines
from trainyard.control.rules.outcome import Outcome
from trainyard.states import AttemptOutcome, JobState

AT = 1796530000.0


def out(cause: str, reason: str, code: int | None = None, sig: int | None = None) -> Outcome:
    return Outcome(JobState.FAILED, AttemptOutcome.FAILED, reason, code, sig, cause)


@pytest.mark.parametrize("cause, due", [("cancelled", ""), ("timeout", " DUE TO TIME LIMIT"),
                                        ("preempted", " DUE TO PREEMPTION"), ("node_lost", " DUE TO NODE FAILURE"),
                                        ("requeued", " DUE TO JOB REQUEUE")])
def test_a_stop_is_slurms_line_then_the_reason(cause, due):
    got = lines(7, 2, "node-1", out(cause, "Preempted (checkpointed)", None, 15), RankState(0, 1, False, None, 15),
                batch=False, when=AT)
    assert re.fullmatch(rf"trainyard: error: \*\*\* JOB 7 ON node-1 CANCELLED AT \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d{due} \*\*\*",
                        got[0]), got
    assert got[-1] == "trainyard: attempt 2 of job 7 ended: Preempted (checkpointed)" and len(got) == 2


def test_a_failed_rank_gets_sruns_line_a_batch_script_does_not_and_a_completed_job_nothing():
    failed = out("exit_code", "NonZeroExitCode 3 on rank 1", 3)
    got = lines(7, 1, "node-0", failed, RankState(1, 1, False, 3, None), batch=False, when=AT)
    assert got == ["trainyard: error: node-0: rank 1: Exited with exit code 3",
                   "trainyard: attempt 1 of job 7 ended: NonZeroExitCode 3 on rank 1"]
    assert lines(7, 1, "node-0", failed, RankState(0, 1, False, 3, None), batch=True, when=AT) == \
        ["trainyard: attempt 1 of job 7 ended: NonZeroExitCode 3 on rank 1"]
    oom = lines(7, 1, "n", out("oom", "oom: the kernel killed …", None, 9), RankState(0, 1, False, None, 9),
                batch=False, when=AT)
    assert oom[0].startswith("trainyard: error: Detected an oom_kill event in attempt 1 of job 7")
    done = Outcome(JobState.COMPLETED, AttemptOutcome.COMPLETED, "None", 0, None, "completed")
    assert lines(7, 1, "n", done, RankState(0, 1, False, 0, None), batch=False, when=AT) == []
    asked = Outcome(JobState.REQUEUED, AttemptOutcome.REQUEUED, "JobRequestedRequeue (exit 75)", 75, None, "requeued")
    assert lines(7, 1, "n", asked, RankState(0, 1, False, 75, None), batch=False, when=AT) == \
        ["trainyard: attempt 1 of job 7 ended: JobRequestedRequeue (exit 75)"]


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    p = Plane(tmp_path_factory.mktemp("notes") / "d")
    yield p
    p.stop()


def _log(p: Plane, job: int) -> list[str]:
    return (job_dir(p.cp.data_dir, job) / "logs" / "rank-0.log").read_text().splitlines()


def test_a_plain_job_cancelled_or_over_its_time_says_so_at_the_end_of_its_log(plane):
    cancelled = plane.submit(command=["/bin/sh", "-c", "echo started; exec sleep 60"], team="vision")["id"]
    timed = plane.submit(command=["/bin/sh", "-c", "echo started; exec sleep 60"], team="vision", time="0:02")["id"]
    failed = plane.submit(command=["/bin/sh", "-c", "echo started; exit 3"], team="vision")["id"]
    plane.wait(cancelled, "RUNNING")
    plane.admin.post(f"/api/v1/jobs/{cancelled}/cancel")
    plane.wait(cancelled, "CANCELLED")
    tail = _log(plane, cancelled)[-2:]
    assert re.fullmatch(rf"trainyard: error: \*\*\* JOB {cancelled} ON node-\d CANCELLED AT \S+ \*\*\*", tail[0]), tail
    assert tail[1] == f"trainyard: attempt 1 of job {cancelled} ended: Cancelled"
    j = plane.wait(timed, "TIMEOUT", timeout=60)
    assert j["reason"] == "TimeLimit" and _log(plane, timed)[-2].endswith("DUE TO TIME LIMIT ***")
    f = plane.wait(failed, "FAILED")
    assert f["reason"] == "NonZeroExitCode 3 on rank 0" and f["retries"] == 0
    assert _log(plane, failed)[-2:] == [f"trainyard: error: {f['placement'][0]['node']}: rank 0: Exited with exit code 3",
                                        f"trainyard: attempt 1 of job {failed} ended: NonZeroExitCode 3 on rank 0"]
