"""`yard acct` as a user types it, against a real `yard up` (local backend): sacct's outputs (fixed
columns, `--parsable2`, `--json`, `--attempts`, `%width`), and bad arguments that fail naming the
option with exit 2 before any request."""

from __future__ import annotations

import json
import sys
from typing import Iterator

import pytest

from tests.yard_cluster import YardCluster

pytestmark = pytest.mark.xdist_group("acct-cli")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[YardCluster]:
    c = YardCluster(tmp_path_factory.mktemp("acct"), "local")
    try:
        c.ok = c.submit("-G", "2", "-A", "vision", "-J", "fine", "--", sys.executable, "-c", "pass")
        c.bad = c.submit("-G", "1", "-A", "nlp", "-J", "bad|name", "--", sys.executable, "-c", "raise SystemExit(3)")
        for j in (c.ok, c.bad):
            c.wait(j, lambda x: x["state"] in ("COMPLETED", "FAILED"), timeout=60)
        yield c
    finally:
        c.stop()


def test_the_default_table_has_sacct_columns_and_one_line_per_job(cluster):
    out = cluster.yard("acct", "-S", "now-1hour").stdout.splitlines()
    assert out[0].split()[:6] == ["JobID", "JobName", "Team", "User", "Class", "State"]
    assert set(out[1]) <= {"-", " "}
    lines = {int(x.split()[0]): x for x in out[2:]}
    assert set(lines) == {cluster.ok, cluster.bad}
    assert "COMPLETED" in lines[cluster.ok] and "FAILED" in lines[cluster.bad]


def test_parsable2_and_format_with_widths(cluster):
    out = cluster.yard("acct", "-S", "now-1hour", "-P", "-o", "JobID,jobname,account,state,exitcode,gpus,attempts",
                       "-s", "F").stdout.splitlines()
    assert out[0] == "JobID|JobName|Team|State|ExitCode|GPUs|Attempts"
    assert out[1:] == [f"{cluster.bad}|bad/name|nlp|FAILED|3:0|1|1"]  # a '|' in a value cannot split it
    out = cluster.yard("acct", "-S", "now-1hour", "-p", "-n", "-o", "jobid", "-j", str(cluster.ok)).stdout
    assert out == f"{cluster.ok}|\n"
    out = cluster.yard("acct", "-S", "now-1hour", "-n", "-o", "jobname%3,state", "-j", str(cluster.ok)).stdout
    assert out.split()[0] == "fi+"  # cut to its width, as sacct marks it


def test_json_and_attempts_agree_with_the_api(cluster):
    doc = json.loads(cluster.yard("acct", "-S", "now-1hour", "--json").stdout)
    api = cluster.http.get("/api/v1/acct/jobs", params={"starttime": "now-1hour"}).json()
    assert [j["id"] for j in doc["jobs"]] == [j["id"] for j in api["jobs"]] == [cluster.ok, cluster.bad]
    ok = doc["jobs"][0]
    assert ok["gpus"] == 2 and ok["gpu_hours"] > 0 and ok["cause"] == "completed" and ok["class"] == "training"
    tries = json.loads(cluster.yard("acct", "-S", "now-1hour", "--attempts", "--json").stdout)["attempts"]
    # Attempts come in the order they started (their row id, the page cursor); these two start in
    # one loop pass, in either order.
    assert sorted((a["job_id"], a["attempt"]) for a in tries) == [(cluster.ok, 1), (cluster.bad, 1)]
    ok_try = next(a for a in tries if a["job_id"] == cluster.ok)
    assert ok_try["gpu_hours"] == pytest.approx(ok["gpu_hours"])
    table = cluster.yard("acct", "-S", "now-1hour", "--attempts").stdout.splitlines()
    assert table[0].split()[:2] == ["JobID", "Attempt"]


def test_helpformat_lists_every_field(cluster):
    out = cluster.yard("acct", "--helpformat").stdout
    for name in ("jobid", "gpuhours", "lostgpuhours", "lostcauses", "wait", "maxrss", "peakgpumem", "nodelist"):
        assert name in out


@pytest.mark.parametrize("args,needle", [
    (("-S", "yesterday-ish"), "--starttime: cannot read 'yesterday-ish'"),
    (("-E", "25:99"), "--endtime:"),
    (("-S", "now", "-E", "now-2hours"), "--endtime ("),
    (("-o", "jobid,colour"), "--format: unknown field 'colour'"),
    (("-o", "jobid%x"), "--format: 'jobid%x'"),
])
def test_bad_arguments_name_the_option_and_exit_2(cluster, args, needle):
    before = cluster.http.get("/api/v1/events", params={"limit": 10000}).json()["events"]
    r = cluster.yard("acct", *args, check=False)
    assert r.returncode == 2 and needle in r.stderr and r.stdout == "", (r.stdout, r.stderr)
    assert cluster.http.get("/api/v1/events", params={"limit": 10000}).json()["events"] == before


def test_a_bad_state_is_refused_by_the_server_with_exit_2(cluster):
    r = cluster.yard("acct", "-s", "DONE", check=False)
    assert r.returncode == 2 and "state" in r.stderr
