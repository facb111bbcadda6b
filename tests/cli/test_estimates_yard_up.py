"""Start-time estimates as promises through a real `yard up` (local backend, real rank processes,
real SQLite): jobs that queue behind others get estimates that are recorded as they change, their
starts settle the error, and `yard report estimates` and the Prometheus histogram match the rows
read from the store; a job named like one the user ran before is expected to run as long."""

from __future__ import annotations

import json
import sqlite3
import sys
from typing import Any, Iterator

import pytest

from tests.yard_cluster import YardCluster
from trainyard.sim.result import LATE_AFTER_S
from trainyard.services.usage_report import nearest_rank

pytestmark = [pytest.mark.xdist_group("estimates-cli"), pytest.mark.slow]  # a real plane, ~30-60 s


def sleeper(seconds: float) -> list[str]:
    return ["--", sys.executable, "-c", f"import time; time.sleep({seconds})"]


def api_submit(c: YardCluster, **body: Any) -> int:
    r = c.http.post("/api/v1/jobs", json={"workdir": str(c.data_dir), **body})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[YardCluster]:
    c = YardCluster(tmp_path_factory.mktemp("estimates"), "local")
    try:
        # The whole pool for 8 s under a limit of 1 minute: the four behind it are estimated from
        # that limit and start far earlier (the limit, not the run time, is all the plane knows).
        c.head = c.submit("-G", "8", "-A", "vision", "-J", "head", "-q", "interactive", "-t", "1", *sleeper(8))
        # (through the API: four `yard submit` processes take seconds on a loaded machine)
        c.behind = [api_submit(c, gpus=4, team=team, name=f"behind{i}", job_class=cls, time="1m",
                               command=sleeper(1)[1:])
                    for i, (team, cls) in enumerate((("vision", "training"), ("nlp", "training"),
                                                     ("nlp", "batch"), ("vision", "batch")))]
        for j in (c.head, *c.behind):
            c.wait(j, "COMPLETED", timeout=120)
        yield c
    finally:
        c.stop()


def store_rows(c: YardCluster, table: str) -> list[dict[str, Any]]:
    with sqlite3.connect(f"file:{c.data_dir / 'trainyard.db'}?mode=ro", uri=True) as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute(f"SELECT * FROM {table} ORDER BY job_id, " + ("id" if table == "start_estimates" else "attempt"))]  # noqa: S608 (a test's own table names)


def test_waiting_jobs_estimates_are_recorded_and_settled_at_their_start(cluster):
    outcomes = {r["job_id"]: r for r in store_rows(cluster, "estimate_outcomes")}
    estimates = store_rows(cluster, "start_estimates")
    assert cluster.head not in outcomes  # it started at once: it was promised nothing
    assert set(cluster.behind) <= set(outcomes), outcomes
    for jid in cluster.behind:
        o = outcomes[jid]
        mine = [e for e in estimates if e["job_id"] == jid]
        assert mine and o["attempt"] == 1 and o["changes"] == len(mine)
        assert (o["first_at"], o["first_estimate"]) == (mine[0]["at"], mine[0]["est_start"])
        assert o["last_estimate"] == mine[-1]["est_start"]
        attempt = cluster.http.get(f"/api/v1/jobs/{jid}").json()["attempts"][0]
        assert o["started_at"] == pytest.approx(attempt["started_at"])
        assert o["error_s"] == pytest.approx(o["started_at"] - o["first_estimate"])
        assert o["first_at"] >= o["queued_since"]
    # head's limit (60 s) was the estimate of the first ones behind it; they started after ~8 s
    assert min(outcomes[j]["error_s"] for j in cluster.behind) < -30


def test_report_estimates_matches_the_recorded_rows(cluster):
    rows = store_rows(cluster, "estimate_outcomes")
    for by, col in (("class", "job_class"), ("team", "team")):
        rep = json.loads(cluster.yard("report", "estimates", "--since", "now-1hour", "--by", by, "--json").stdout)
        got = {r["key"]: r for r in rep["rows"]}
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault(r[col], []).append(r)
        groups["(all)"] = rows
        assert set(got) == set(groups)
        for key, rs in groups.items():
            errs = sorted(abs(r["error_s"]) for r in rs)
            last = sorted(abs(r["last_error_s"]) for r in rs)
            g = got[key]
            assert g["starts"] == len(rs)
            assert g["p50_abs_error_s"] == pytest.approx(nearest_rank(errs, 50))
            assert g["p90_abs_error_s"] == pytest.approx(nearest_rank(errs, 90))
            assert g["p50_abs_last_error_s"] == pytest.approx(nearest_rank(last, 50))
            assert g["late_share"] == pytest.approx(sum(r["error_s"] > LATE_AFTER_S for r in rs) / len(rs))
            assert g["mean_error_s"] == pytest.approx(sum(r["error_s"] for r in rs) / len(rs))
    table = cluster.yard("report", "estimates", "-S", "now-1hour").stdout
    assert "P50Err" in table and "training" in table and "(all)" in table
    # nothing started in a period before the workload
    empty = json.loads(cluster.yard("report", "estimates", "-S", "now-3hours", "-E", "now-2hours", "--json").stdout)
    assert empty["rows"] == []


def test_the_prometheus_histogram_counts_the_recorded_rows(cluster):
    rows = store_rows(cluster, "estimate_outcomes")
    text = cluster.http.get("/metrics").text
    for cls in {r["job_class"] for r in rows}:
        mine = [r for r in rows if r["job_class"] == cls]
        assert f'trainyard_start_estimate_error_seconds_count{{class="{cls}"}} {float(len(mine))}' in text
        under_min = sum(abs(r["error_s"]) <= 60.0 for r in mine)
        assert f'trainyard_start_estimate_error_seconds_bucket{{class="{cls}",le="60.0"}} {float(under_min)}' in text
        late = sum(r["error_s"] > LATE_AFTER_S for r in mine)
        assert f'trainyard_start_estimate_late_total{{class="{cls}"}} {float(late)}' in text


def test_a_job_named_as_a_past_one_is_expected_to_run_as_long(cluster):
    again = cluster.submit("-G", "1", "-A", "vision", "-J", "behind0", "-t", "1", *sleeper(1))
    job = cluster.http.get(f"/api/v1/jobs/{again}").json()
    first = cluster.http.get(f"/api/v1/jobs/{cluster.behind[0]}").json()
    assert job["expected_runtime_s"] == pytest.approx(first["end_time"] - first["start_time"])
    other = cluster.submit("-G", "1", "-A", "vision", "-J", "never-ran", "-t", "1", *sleeper(0))
    assert cluster.http.get(f"/api/v1/jobs/{other}").json()["expected_runtime_s"] is None
    for j in (again, other):
        cluster.wait(j, "COMPLETED", timeout=60)


def test_bad_report_arguments_fail_naming_the_option(cluster):
    r = cluster.yard("report", "estimates", "--by", "user", check=False)
    assert r.returncode == 2 and "--by" in r.stderr
    r = cluster.http.get("/api/v1/report/estimates", params={"by": "node"})
    assert r.status_code == 400 and r.json()["field"] == "by"
