"""`sim.side_by_side.what_if_rows`: the what-if's answer as the configuration page's table rows
(the page itself, on a real plane: tests/api/test_dashboard_config.py)."""

from __future__ import annotations

from trainyard.sim.side_by_side import FIGURES, OVERALL, what_if_rows


def side(teams: dict, classes: dict, wait: float) -> dict:
    return {"metrics": {"avg_wait_s": wait, "p99_wait_s": 2 * wait, "utilization": 0.5}, "teams": teams, "classes": classes}


def test_rows_are_the_whole_cluster_then_each_team_and_class_that_had_jobs() -> None:
    a_team = {"jobs": 3, "p99_wait_s": 60, "quota_share": 0.5, "preemptions": 1}
    b_team = {"jobs": 3, "p99_wait_s": 90, "quota_share": 0.25, "preemptions": 1}
    doc = {"in_force": side({"x": a_team, "old": {"jobs": 2, "p99_wait_s": 5}}, {"idle": {"jobs": 0, "p99_wait_s": 0}}, 10),
           "proposed": side({"x": b_team, "new": {"jobs": 1, "p99_wait_s": 7}}, {"idle": {"jobs": 0, "p99_wait_s": 0}}, 12),
           "delta": {"metrics": {"avg_wait_s": 2, "p99_wait_s": 4, "utilization": 0.0},
                     "teams": {"x": {"p99_wait_s": 30, "quota_share": -0.25, "preemptions": 0}}, "classes": {}}}
    rows = what_if_rows(doc)
    assert [r["figure"] for r in rows[:len(OVERALL)]] == [f for f, _ in OVERALL]
    assert rows[0] == {"group": "all jobs", "figure": "avg_wait_s", "kind": "s", "in_force": 10.0, "proposed": 12.0,
                       "delta": 2.0}
    assert rows[2]["in_force"] is None  # a figure the answer lacks: no number, not 0
    groups = [r["group"] for r in rows[len(OVERALL):]]
    assert groups == ["team new", "team old", "team x", "team x", "team x"]  # no class: none had jobs
    x = [r for r in rows if r["group"] == "team x"]
    assert [r["figure"] for r in x] == [f for f, _ in FIGURES if f in a_team]
    assert x[1] == {"group": "team x", "figure": "quota_share", "kind": "share", "in_force": 0.5, "proposed": 0.25,
                    "delta": -0.25}
    new = next(r for r in rows if r["group"] == "team new")
    assert (new["in_force"], new["proposed"], new["delta"]) == (None, 7.0, None)  # a team on one side only
