"""The dashboard's data, without a browser: cluster map, queue grouping, logs access, loss curves,
allocation and wait over time (services/dashboard.py, services/dashboard_history.py), and the
chart geometry (api/charts.py).

The plane runs without its loop, so the rows a test writes stay as written.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.plane import Plane, job_dir, script
from trainyard.api import charts
from trainyard.services import dashboard, dashboard_history
from trainyard.services.auth import Principal
from trainyard.store.models import AttemptRow, JobRow, NodeRow

ADMIN = Principal("admin", "admin")
VIEWER = Principal("vic", "viewer")
NLP = Principal("nora", "member", "nlp")
VISION = Principal("vera", "member", "vision")


@pytest.fixture
def plane(tmp_path):
    p = Plane(tmp_path / "yard", start=False)
    yield p
    p.cp.stop()


def submit(p: Plane, **body) -> int:
    return p.submit(command=script("pass"), **body)["id"]


def edit(p: Plane, job_id: int, **values) -> None:
    with p.cp.store.session.begin() as s:
        row = s.get(JobRow, job_id)
        for k, v in values.items():
            setattr(row, k, v)


def test_cluster_map_puts_each_running_job_on_its_gpus_and_shows_node_health(plane):
    a = submit(plane, team="vision", gpus=2, name="a")
    b = submit(plane, team="nlp", nodes=2, gpus_per_node=1, name="b")
    edit(plane, a, state="RUNNING", placement=[{"node": "node-0", "gpus": [1, 2]}], start_time=time.time())
    edit(plane, b, state="COMPLETING", placement=[{"node": "node-0", "gpus": [0]}, {"node": "node-1", "gpus": [3]}])
    shares = submit(plane, team="nlp", gpu_mem_gb=4, name="shares a GPU")
    edit(plane, shares, state="RUNNING", placement=[{"node": "node-1", "gpus": [3]}])
    with plane.cp.store.session.begin() as s:
        s.add(NodeRow(name="node-1", state="suspect", reason="ecc: 3 corrected errors (health)"))
    with plane.cp.store.session() as s:
        cards = dashboard.cluster_map(s, plane.cp.configs.current(s), VIEWER)
    assert [c.name for c in cards] == ["node-0", "node-1"]
    n0, n1 = cards
    assert [g.job["id"] if g.job else None for g in n0.gpus] == [b, a, a, None]
    assert [g.job["id"] if g.job else None for g in n1.gpus] == [None, None, None, b]
    assert [x["id"] for x in n1.gpus[3].jobs] == [b, shares]  # jobs asking for GPU memory share a GPU
    assert n0.used == 3 and n0.state == "up"
    assert (n1.state, n1.reason) == ("suspect", "ecc: 3 corrected errors (health)")
    assert n0.gpus[1].job == {"id": a, "name": "a", "team": "vision", "user": "admin", "class": "training",
                              "placement": [{"node": "node-0", "gpus": [1, 2]}]}
    s = dashboard.summary(cards, [], [])
    assert (s["gpus"], s["gpus_used"], s["gpus_idle"]) == (8, 4, 4)  # a shared GPU counts once
    assert s["nodes_by_state"] == {"up": 1, "suspect": 1}


def test_queue_groups_by_team_then_class_priority_and_orders_by_estimated_start(plane):
    ids = {}
    for name, team, cls in (("n-train", "nlp", "training"), ("v-batch", "vision", "batch"),
                            ("v-train-late", "vision", "training"), ("v-train-soon", "vision", "training"),
                            ("v-train-none", "vision", "training"), ("v-inter", "vision", "interactive")):
        ids[name] = submit(plane, team=team, **{"class": cls}, name=name)
    now = time.time()
    edit(plane, ids["v-train-late"], est_start=now + 600, reason="Resources")
    edit(plane, ids["v-train-soon"], est_start=now + 60, reason="Priority")
    edit(plane, ids["n-train"], state="REQUEUED")
    with plane.cp.store.session() as s:
        groups = dashboard.queue(s, plane.cp.configs.current(s), VIEWER)
        short = dashboard.queue(s, plane.cp.configs.current(s), VIEWER, limit=1)
    # teams in configuration order (vision, nlp), classes by priority (interactive 300 > training > batch)
    assert [(g.team, g.job_class) for g in groups] == [("vision", "interactive"), ("vision", "training"),
                                                      ("vision", "batch"), ("nlp", "training")]
    assert [j["name"] for j in groups[1].jobs] == ["v-train-soon", "v-train-late", "v-train-none"]
    assert groups[1].jobs[0]["reason"] == "Priority"
    assert groups[3].jobs[0]["state"] == "REQUEUED"
    assert [(len(g.jobs), g.more) for g in short] == [(1, 0), (1, 2), (1, 0), (1, 0)]
    # what the API hides from other teams, the dashboard's data hide too
    assert groups[3].jobs[0]["command"] is None
    with plane.cp.store.session() as s:
        mine = dashboard.queue(s, plane.cp.configs.current(s), NLP)
    assert mine[3].jobs[0]["command"] is not None and mine[0].jobs[0]["command"] is None


def test_logs_only_for_who_the_api_lets_read_them(plane):
    a = submit(plane, team="vision", name="a")
    logs = job_dir(plane.cp.data_dir, a) / "logs"
    logs.mkdir(parents=True)
    (logs / "rank-0.log").write_text("first\n" + "x" * (dashboard.LOG_TAIL_BYTES + 10) + "\nlast line\n")
    (logs / "rank-1.log").write_text("rank one\n")
    with plane.cp.store.session() as s:
        views = {who.user: dashboard.job_logs(s, plane.cp.data_dir, a, who) for who in (ADMIN, VIEWER, NLP, VISION)}
        one = dashboard.job_logs(s, plane.cp.data_dir, a, VISION, rank=1)
    assert views["admin"].allowed and views["vera"].allowed
    assert views["vera"].ranks == [0, 1] and views["vera"].cut
    assert views["vera"].text.endswith("last line\n") and "first" not in views["vera"].text
    assert one.text == "rank one\n" and not one.cut
    assert not views["vic"].allowed and views["vic"].text == ""
    assert views["vic"].why == f"a viewer token cannot read the logs of job {a} (team 'vision')"
    assert views["nora"].why == f"a member token of team nlp cannot read the logs of job {a} (team 'vision')"


def _metrics(path, lines) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((json.dumps(x) if not isinstance(x, str) else x) + "\n" for x in lines))


def test_loss_curve_takes_the_last_line_per_step_and_marks_resumes(tmp_path):
    _metrics(tmp_path / "metrics" / "metrics.jsonl", [
        *({"step": s, "loss": 10.0 - s, "attempt": 1, "time": 1.0} for s in range(1, 7)),
        {"event": "resume", "step": 4, "attempt": 2, "discarded_steps": 2},
        *({"step": s, "loss": 20.0 - s, "attempt": 2, "time": 2.0} for s in range(5, 9)),
        {"step": 7, "loss": "nan", "attempt": 2, "time": 2.0},
        '{"step": 9, "loss": 1.',  # cut by a kill -9
        {"step": 10, "lr": 0.1},  # no loss: not a point
    ])
    c = dashboard.loss_curve(tmp_path)
    assert c.steps == [1, 2, 3, 4, 5, 6, 8]
    assert c.values == [9.0, 8.0, 7.0, 6.0, 15.0, 14.0, 12.0]
    assert c.non_finite == [7] and c.resumes == [4] and c.total_steps == 7
    assert dashboard.loss_curve(tmp_path / "nowhere") == dashboard.LossCurve([], [], 0, [], [])


def test_loss_curve_of_a_long_run_is_thinned_but_keeps_its_last_step(tmp_path):
    _metrics(tmp_path / "metrics" / "metrics.jsonl", ({"step": s, "loss": 1.0 / s} for s in range(1, 5001)))
    c = dashboard.loss_curve(tmp_path, max_points=2000)
    assert c.total_steps == 5000 and len(c.steps) <= 2001
    assert c.steps[:3] == [1, 4, 7] and c.steps[-1] == 5000 and c.values[-1] == 1.0 / 5000


def test_history_from_attempts_and_waits(plane):
    """Allocation from each attempt's GPUs and span, waiting from submissions, requeues and
    cancellations, wait of each started attempt; 60 one-minute buckets over the last hour."""
    now = 1_000_000.0
    a = submit(plane, team="vision", gpus=4, name="requeued then running")
    b = submit(plane, team="nlp", name="still waiting")
    c = submit(plane, team="nlp", name="cancelled while waiting")
    d = submit(plane, team="nlp", name="done before the window")
    edit(plane, a, submit_time=now - 3000, queued_since=now - 1200, state="RUNNING", start_time=now - 600, attempt=2)
    edit(plane, b, submit_time=now - 1800, queued_since=now - 1800)
    edit(plane, c, submit_time=now - 3000, queued_since=now - 3000, state="CANCELLED", end_time=now - 2700)
    edit(plane, d, submit_time=now - 9000, queued_since=now - 9000, state="COMPLETED", start_time=now - 8000,
         end_time=now - 7000)
    with plane.cp.store.session.begin() as s:
        s.add(AttemptRow(job_id=a, attempt=1, placement=[{"node": "node-0", "gpus": [0, 1, 2, 3]}],
                         started_at=now - 2400, ended_at=now - 1200, state="PREEMPTED"))
        s.add(AttemptRow(job_id=a, attempt=2, placement=[{"node": "node-1", "gpus": [0, 1]}],
                         started_at=now - 600, ended_at=None, state="RUNNING"))
        s.add(AttemptRow(job_id=d, attempt=1, placement=[{"node": "node-1", "gpus": [3]}],
                         started_at=now - 8000, ended_at=now - 7000, state="COMPLETED"))
    with plane.cp.store.session() as s:
        h = dashboard_history.history(s, plane.cp.configs.current(s), now, 3600.0, buckets=60)
    assert h.capacity == 8 and h.bucket_s == 60.0
    assert h.allocated == [0.0] * 20 + [4.0] * 20 + [0.0] * 10 + [2.0] * 10
    want = [0.0] * 60
    for lo, hi in ((10, 20), (40, 50), (30, 60), (10, 15)):  # a before each attempt, b, c
        for i in range(lo, hi):
            want[i] += 1.0
    assert h.waiting == want
    assert h.started == [0] * 20 + [1] + [0] * 29 + [1] + [0] * 9
    assert h.wait_mean_s[20] == h.wait_max_s[20] == 600.0 and h.wait_mean_s[50] == 600.0
    assert h.wait_mean_s[0] is None
    # a window that starts halfway through a bucket's worth of work counts only its share
    with plane.cp.store.session() as s:
        h2 = dashboard_history.history(s, plane.cp.configs.current(s), now - 1170, 60.0, buckets=1)
    assert h2.allocated == [pytest.approx(4.0 * 30 / 60)]


def test_charts_break_lines_at_gaps_and_pick_round_ticks():
    assert charts.nice_ticks(0, 100, 4) == [0, 20, 40, 60, 80, 100]
    assert charts.nice_ticks(4.1, 5.6, 4) == [4.5, 5.0, 5.5]
    c = charts.line_chart("t", [charts.Series("s", [(0, 1.0), (1, 2.0), (2, None), (3, 1.5), (4, None),
                                                    (5, 1.0), (6, 3.0)])], width=300, height=100)
    assert len(c.lines) == 2 and all(len(pts.split()) == 2 for _, pts, _ in c.lines)
    assert len(c.dots) == 1 and c.dots[0][3] == "s: 1.5 at 3"  # the lone point between gaps
    left, top, right, bottom = c.box
    xs = [float(p.split(",")[0]) for _, pts, _ in c.lines for p in pts.split()]
    assert xs[0] == left and xs[-1] == right
    assert charts.line_chart("t", [charts.Series("s", [(0, None)])]).empty == "no data yet"
    assert charts.duration_ticks(0, 420, 4) == [0, 120, 240, 360]  # 2-minute steps, not 100 s
    assert charts.duration_ticks(0, 7 * 3600, 4) == [0, 7200, 14400, 21600]
    assert charts.duration_ticks(0, 0.06, 4) == [0, 0.02, 0.04, 0.06]  # under a second: decimal steps
    assert charts.fmt_ago(-3600) == "-1h" and charts.fmt_ago(0) == "now" and charts.fmt_ago(-600) == "-10m"
    assert charts.fmt_duration(42) == "42s" and charts.fmt_duration(5400) == "1.5h"
