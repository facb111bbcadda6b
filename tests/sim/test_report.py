"""Report writing from hand-built results (no simulator needed)."""

import json

from trainyard.sched.cluster import Node
from trainyard.sched.types import JobRequest, Quota, Team
from trainyard.sim.report import COLUMNS, format_table, hourly_means, markdown_table, write_report
from trainyard.sim.result import JobRecord, SimResult
from trainyard.sim.workload import SimJob, Workload

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
METRICS = ["jobs", "utilization", "goodput", "avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_wait_s", "p99_wait_s",
           "avg_bounded_slowdown", "makespan_s", "preemptions", "lost_gpu_hours", "jain_fairness", "quota_violations"]


def _workload() -> Workload:
    nodes = [Node(f"n{i}", 8, 80 * 1024, block="b0", rack=f"r{i // 2}") for i in range(4)]
    teams = {"a": Team("a", "c", {"default": Quota(20)}), "b": Team("b", "c", {"default": Quota(12)})}
    jobs = [SimJob(JobRequest(i, "ab"[i % 2], "training", i * 600.0, gpus=4), 3600.0) for i in range(10)]
    return Workload(nodes, teams, {}, jobs, measure_from=600.0, measure_to=20000.0, name="tiny", notes=["a note"])


def _result(policy: str, slow: float) -> SimResult:
    recs = []
    for i in range(10):
        start = i * 600.0 + slow * i
        recs.append(JobRecord(i, "ab"[i % 2], "training", 4, i * 600.0, 3600.0, first_start=start,
                              end=start + 3600.0, wait_s=slow * i, preemptions=i % 3, lost_gpu_s=100.0 * (i % 3),
                              measured=i > 0))
    util = [(0.0, 0), (0.0, 4), (600.0, 8), (3600.0, 12), (9000.0, 8), (15000.0, 0)]
    team = {"a": [(0.0, 4), (3600.0, 8), (15000.0, 0)], "b": [(600.0, 4), (15000.0, 0)]}
    return SimResult(policy, 32, 600.0, 20000.0, recs, util_series=util, team_series=team,
                     nominal={"a": 20, "b": 12}, busy_gpu_s_in_window=150000.0, lost_gpu_s_in_window=1000.0,
                     end_time=20000.0)


def test_write_report_files(tmp_path):
    results = {"trainyard": _result("trainyard", 0.0), "fifo": _result("fifo", 300.0)}
    out = tmp_path / "rep"
    write_report(out, results, _workload(), {"command": "yard sim --seed 1", "seed": 1})
    doc = json.loads((out / "report.json").read_text())
    assert set(doc["policies"]) == {"trainyard", "fifo"}
    for name in METRICS:
        assert name in doc["policies"]["trainyard"], name
    assert doc["policies"]["trainyard"]["jobs"] == 9
    assert doc["meta"]["seed"] == 1 and doc["meta"]["notes"] == ["a note"] and "definitions" in doc["meta"]
    md = (out / "report.md").read_text()
    assert "| policy | " + " | ".join(COLUMNS) + " |" in md
    assert "| trainyard |" in md and "| fifo |" in md and "a note" in md and "jain_fairness" in md
    for png in ("utilization.png", "wait_cdf.png", "team_share.png"):
        data = (out / png).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000


def test_tables():
    results = {"trainyard": _result("trainyard", 0.0)}
    md = markdown_table(results)
    assert md.count("\n") == 2 and "(" in md  # durations in s and human-readable
    table = format_table(results)
    assert table.row_count == len(COLUMNS) and len(table.columns) == 2


def test_hourly_means_is_time_weighted():
    x, y = hourly_means([(0.0, 0), (1800.0, 10)], 0.0, 7200.0)
    assert list(x) == [0.0, 3600.0]
    assert list(y) == [5.0, 10.0]
    x, y = hourly_means([], 0.0, 3600.0)
    assert list(y) == [0.0]
