"""`yard queue` and `yard events` as a person sees them in an 80- and a 150-column terminal (issue 17,
item 5): ids, users and states stay whole and only names and reasons are cut; squeue's `-o`/`-O`
choose the columns; an estimated start that is not today shows its date. Real `yard` processes
against a real `yard up`."""

from __future__ import annotations

import json
import sys
import time

import pytest

from tests.cli.yard_process import job_id_of, yard_process

LONG_NAME = "a-rather-long-experiment-name-for-the-learning-rate-sweep"
WHY = "the loss went to NaN at step 1200 on every rank of the job, giving up after three retries of it"


def wait_for(yard, jid: int, pred, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        j = json.loads(yard("show", str(jid), "--json").stdout)
        if pred(j):
            return j
        assert time.monotonic() < deadline, j
        time.sleep(0.2)


# One worker for this module's tests under `make test`'s --dist loadgroup: its module-scoped
# yard up starts once, not once per worker (about 4 s of CPU each).
pytestmark = pytest.mark.xdist_group("cli-queue-layout")


@pytest.fixture(scope="module")
def yard(tmp_path_factory):
    yield from yard_process(tmp_path_factory, "layout")


@pytest.fixture(scope="module")
def jobs(yard):
    """A failed job with a long name and a long reason; a 2-day job on all 8 GPUs; one waiting behind it."""
    # a job that used the runtime (its metrics file) and failed before its first step: a long reason
    wrote_metrics = ("import os, pathlib, sys; pathlib.Path(os.environ['TRAINYARD_CHECKPOINT_DIR'], '..', 'metrics', 'metrics.jsonl')"
                     f".write_text(''); sys.exit({WHY!r})")
    failed = job_id_of(yard("submit", "-A", "nlp", "-J", LONG_NAME, "--", sys.executable, "-c", wrote_metrics))
    j = wait_for(yard, failed, lambda j: j["state"] == "FAILED")
    assert len(j["reason"]) > 40, j["reason"]  # long enough to push the columns
    big = job_id_of(yard("submit", "-A", "vision", "-G", "8", "-t", "2-0", "-J", "two-days", "--", "sleep", "600"))
    wait_for(yard, big, lambda j: j["state"] == "RUNNING")
    behind = job_id_of(yard("submit", "-A", "nlp", "-G", "8", "-J", "behind", "--", "true"))
    j = wait_for(yard, behind, lambda j: j["est_start"] is not None)
    return {"failed": failed, "big": big, "behind": behind, "user": j["user"], "est_start": j["est_start"]}


def rows_by_id(lines: list[str]) -> dict[str, str]:
    return {line.split()[0]: line for line in lines[1:]}


@pytest.mark.parametrize("columns", [80, 150])
def test_ids_users_and_states_stay_whole_and_the_reason_is_cut(yard, jobs, columns):
    out = yard("queue", "--all", env_extra={"COLUMNS": str(columns)}).stdout.splitlines()
    assert out[0].split()[:3] == ["JOBID", "NAME", "TEAM"]
    assert all(len(line) <= columns for line in out), "\n".join(out)
    rows = rows_by_id(out)
    for key, state in (("failed", "FAILED"), ("big", "RUNNING"), ("behind", "PENDING")):
        row = rows[str(jobs[key])]
        assert f" {jobs['user']} " in row and f" {state} " in row, row
    failed = rows[str(jobs["failed"])]
    assert " nlp " in failed and failed.endswith("…") and "…" in failed.split()[1]  # name and reason cut
    assert LONG_NAME not in failed and WHY not in failed


def test_a_wider_terminal_shows_more_of_the_reason_and_a_pipe_all_of_it(yard, jobs):
    def reason_shown(env: dict) -> str:
        row = rows_by_id(yard("queue", "--all", env_extra=env).stdout.splitlines())[str(jobs["failed"])]
        return row[row.index("(User"):]

    narrow, wide, piped = reason_shown({"COLUMNS": "80"}), reason_shown({"COLUMNS": "150"}), reason_shown({"COLUMNS": ""})
    assert len(narrow) < len(wide) < len(piped) and piped.endswith(")") and "…" not in piped
    piped_row = rows_by_id(yard("queue", "--all", env_extra={"COLUMNS": ""}).stdout.splitlines())[str(jobs["failed"])]
    assert LONG_NAME in piped_row


def test_an_estimated_start_that_is_not_today_shows_its_date(yard, jobs):
    day = time.strftime("%m-%dT%H:%M", time.localtime(jobs["est_start"]))
    assert time.localtime(jobs["est_start"]).tm_yday != time.localtime().tm_yday  # two days on
    row = rows_by_id(yard("queue", env_extra={"COLUMNS": "150"}).stdout.splitlines())[str(jobs["behind"])]
    assert day in row, row


def test_squeue_printf_format(yard, jobs):
    out = yard("queue", "--all", "-o", "%.6i|%u|%.2t|%.10M|%q|%.12j|%R").stdout.splitlines()
    assert out[0] == " JOBID|USER|ST|      TIME|CLASS|        NAME|NODELIST(REASON)"
    rows = {line.split("|")[0].strip(): line.split("|") for line in out[1:]}
    failed, big = rows[str(jobs["failed"])], rows[str(jobs["big"])]
    assert failed[1] == jobs["user"] and failed[2] == " F" and failed[5] == LONG_NAME[:12]
    assert failed[6].startswith("(UserError") and failed[6].endswith(")")  # no size: whole
    assert big[2] == " R" and big[6].startswith("node-")
    headless = yard("queue", "-h", "-o", "%i %t").stdout.splitlines()
    assert sorted(headless) == sorted([f"{jobs['big']} R", f"{jobs['behind']} PD"])


def test_squeue_names_format(yard, jobs):
    out = yard("queue", "--all", "-O", "JobID,UserName,StateCompact,Reason:14,TimeLimit",
               env_extra={"COLUMNS": "80"}).stdout.splitlines()
    assert out[0].split() == ["JOBID", "USER", "ST", "REASON", "TIME_LIMIT"]
    rows = rows_by_id(out)
    assert rows[str(jobs["failed"])].split()[1:3] == [jobs["user"], "F"] and "UserError: fa…" in rows[str(jobs["failed"])]
    assert rows[str(jobs["big"])].split()[1:] == [jobs["user"], "R", "None", "2-00:00:00"]
    assert rows_by_id(yard("queue", "-o", "id,timeleft").stdout.splitlines())[str(jobs["behind"])].split()[1] == \
        "UNLIMITED"


@pytest.mark.parametrize("args, words", [
    (["-o", "%i %z"], ["--format", "%z"]),
    (["-o", "%i %"], ["--format", "'%'"]),
    (["-O", "id,colour"], ["--Format", "'colour'"]),
    (["-O", "id:wide"], ["--Format", "'id:wide'"]),
    (["-o", "%i", "-O", "id"], ["--format", "--Format"]),
])
def test_a_bad_format_names_the_option(yard, args, words):
    p = yard("queue", *args, ok=False)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1
    for w in words:
        assert w in p.stderr, p.stderr


@pytest.mark.parametrize("columns", [80, 150])
def test_events_keep_the_job_whole_and_cut_the_message(yard, jobs, columns):
    out = yard("events", env_extra={"COLUMNS": str(columns)}).stdout.splitlines()
    assert out[0].split() == ["TIME", "ACTOR", "EVENT", "JOB", "NODE", "WHY"]
    assert all(len(line) <= columns for line in out), "\n".join(out)
    failed = [line for line in out if " job.failed " in line]
    assert failed and f" {jobs['failed']} " in failed[-1], failed
    whole = [e["message"] for e in json.loads(yard("events", "--json").stdout) if e["kind"] == "job.failed"][-1]
    if len(failed[-1]) - len(failed[-1][out[0].index("WHY"):]) + len(whole) > columns:
        assert failed[-1].endswith("…") and whole not in failed[-1]
    else:
        assert failed[-1].endswith(whole)
    mine = yard("events", str(jobs["failed"]), "-o", "event,job,why:20", env_extra={"COLUMNS": ""}).stdout.splitlines()
    at = mine[0].index("WHY")
    assert any("job.submitted" in line for line in mine) and all(len(line[at:]) <= 20 for line in mine)
    bad = yard("events", "-o", "time,colour", ok=False)
    assert bad.returncode == 2 and "--format: unknown field 'colour'" in bad.stderr
