"""The goodput ledger through a real `yard up` (local backend, real rank processes): each ended
job's buckets add up to its allocated GPU-seconds, `yard acct` shows them, `yard report goodput`'s
team totals equal the sum of their jobs', a requeued attempt's recompute is its lost work, and
bad arguments fail naming the option with exit 2."""

from __future__ import annotations

import json
import math
import sys
from typing import Iterator

import pytest

from tests.yard_cluster import YardCluster
from trainyard.contracts import LEDGER_BUCKETS

pytestmark = pytest.mark.xdist_group("goodput-cli")

REQUEUE_ONCE = ("import os, sys, time; print('hello', flush=True); time.sleep(1.0);"
                "sys.exit(75 if os.environ['TRAINYARD_ATTEMPT'] == '1' else 0)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[YardCluster]:
    c = YardCluster(tmp_path_factory.mktemp("goodput"), "local")
    try:
        c.bare = c.submit("-G", "2", "-A", "vision", "-J", "bare", "--", sys.executable, "-c",
                          "import time; print('up', flush=True); time.sleep(1.5)")
        c.again = c.submit("-G", "1", "-A", "vision", "-J", "again", "--", sys.executable, "-c", REQUEUE_ONCE)
        c.other = c.submit("-G", "1", "-A", "nlp", "-J", "other", "--", sys.executable, "-c", "raise SystemExit(3)")
        for j in (c.bare, c.again, c.other):
            c.wait(j, lambda x: x["state"] in ("COMPLETED", "FAILED"), timeout=90)
        yield c
    finally:
        c.stop()


def goodput(c: YardCluster, job_id: int) -> dict:
    r = c.http.get(f"/api/v1/jobs/{job_id}/goodput")
    assert r.status_code == 200, r.text
    return r.json()


def test_each_ended_jobs_buckets_add_up_to_its_allocated_gpu_seconds(cluster):
    for jid in (cluster.bare, cluster.again, cluster.other):
        g = goodput(cluster, jid)
        assert set(g) == {"job_id", "allocated_gpu_s", "buckets", "attempts"} and g["job_id"] == jid
        tries = cluster.http.get(f"/api/v1/jobs/{jid}").json()["attempts"]
        assert len(g["attempts"]) == len(tries) >= 1
        for a, t in zip(g["attempts"], tries):
            assert set(a) == {"attempt", "started_at", "ended_at", "gpus", "allocated_gpu_s", "buckets", "live"}
            assert not a["live"] and set(a["buckets"]) == set(LEDGER_BUCKETS)
            assert all(v >= 0 for v in a["buckets"].values())
            assert math.fsum(a["buckets"].values()) == pytest.approx(a["gpus"] * (a["ended_at"] - a["started_at"]),
                                                                     abs=1e-6)
            assert a["buckets"]["recompute"] == pytest.approx(t["lost_gpu_s"], abs=1e-6)
        assert g["allocated_gpu_s"] == pytest.approx(math.fsum(a["allocated_gpu_s"] for a in g["attempts"]))


def test_a_requeued_attempts_recompute_is_its_lost_work(cluster):
    tries = cluster.http.get(f"/api/v1/jobs/{cluster.again}").json()["attempts"]
    assert len(tries) == 2 and tries[0]["lost_gpu_s"] > 0.5
    first = goodput(cluster, cluster.again)["attempts"][0]["buckets"]
    assert first["recompute"] == pytest.approx(tries[0]["lost_gpu_s"], abs=1e-6)


def test_report_goodput_team_totals_equal_the_sum_of_their_jobs(cluster):
    rep = json.loads(cluster.yard("report", "goodput", "-S", "now-1hour", "--by", "team,cluster", "--json").stdout)
    teams = {r["key"]: r for r in rep["sections"]["team"]}
    for team, jobs in (("vision", (cluster.bare, cluster.again)), ("nlp", (cluster.other,))):
        for b in LEDGER_BUCKETS:
            assert teams[team]["buckets"][b] == pytest.approx(sum(goodput(cluster, j)["buckets"][b] for j in jobs),
                                                              abs=1e-6)
    (c,) = rep["sections"]["cluster"]
    assert c["allocated_gpu_s"] == pytest.approx(sum(t["allocated_gpu_s"] for t in teams.values()))
    table = cluster.yard("report", "goodput", "-S", "now-1hour").stdout
    for name in ("cluster", "team", "user", "node", "class"):
        assert f"\n{name}" in table
    assert "ComputeGPUh" in table and "Goodput%" in table


def test_yard_acct_shows_the_buckets_and_the_goodput(cluster):
    out = cluster.yard("acct", "-S", "now-1hour", "-P", "-o",
                       "jobid,gpuhours,startup,compute,datawait,ckptstall,commwait,recompute,idle,teardown,goodput",
                       "-j", str(cluster.bare)).stdout.splitlines()
    assert out[0] == ("JobID|GPUHours|StartupGPUh|ComputeGPUh|DataWaitGPUh|CkptStallGPUh|CommWaitGPUh|RecomputeGPUh|"
                      "IdleGPUh|TeardownGPUh|Goodput")
    cells = out[1].split("|")
    assert sum(float(x) for x in cells[2:10]) == pytest.approx(float(cells[1]), abs=5e-4)
    assert cells[10].endswith("%")
    helpf = cluster.yard("acct", "--helpformat").stdout
    assert all(n in helpf for n in ("startup", "datawait", "ckptstall", "commwait", "recompute", "goodput"))


@pytest.mark.parametrize("args,needle", [
    (("report", "goodput", "--by", "team,rack"), "--by: 'rack' is not one of cluster, team, user, node, class"),
    (("report", "teams", "--by", "team"), "--by: only with the goodput and estimates sections"),
])
def test_bad_arguments_name_the_option_and_exit_2(cluster, args, needle):
    r = cluster.yard(*args, check=False)
    assert r.returncode == 2 and needle in r.stderr and r.stdout == "", (r.stdout, r.stderr)


def test_who_may_read_a_jobs_goodput(cluster):
    r = cluster.http.get("/api/v1/jobs/999999/goodput")
    assert r.status_code == 404
    assert cluster.http.get("/api/v1/report/goodput", params={"by": "rack"}).status_code == 400
