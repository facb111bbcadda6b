"""Issue 34, point 7: the numbers a job reports never break a page or an API response.

A real job on a real plane writes a metrics.jsonl of hostile figures (`1e308`, `NaN`, `Infinity`,
`-1e400`, a 400-digit integer, a string, a step of 10**30 or `true`) and sends progress reports with
its own token (1e308, a 400-digit integer, NaN). Every page and response that shows them answers
(the job page, the overview, the job and the job list in the API, its events, /metrics); the loss
chart draws only the numbers a scale can hold and says how many it left out. `loss: 1e308` and the
400-digit integer made the job page answer 500; the integer in a progress report made the
overview answer 500 for everyone.
"""

from __future__ import annotations

import math
import re
import time

import pytest

from tests.plane import Plane, job_dir, script
from trainyard import figures
from trainyard.api import charts

HUGE = 10**400
LINES = [
    '{"step": 1, "loss": 2.5}', '{"step": 2, "loss": 1e308}', '{"step": 3, "loss": NaN}',
    '{"step": 4, "loss": Infinity}', '{"step": 5, "loss": -1e400}', f'{{"step": 6, "loss": {HUGE}}}',
    '{"step": 7, "loss": "x"}', '{"step": 8, "loss": -1e308}', '{"step": 9, "loss": 5e-324}',
    '{"step": 1000000000000000000000000000000, "loss": 2.0}', '{"step": true, "loss": 3.0}',
    f'{{"step": {HUGE}, "loss": 1.0}}', '{"step": 10, "loss": 1.5}',
]
JOB = """
import os, pathlib, sys, time
ck = pathlib.Path(os.environ['TRAINYARD_CHECKPOINT_DIR'])
m = pathlib.Path(os.environ.get('TRAINYARD_METRICS_DIR') or ck.parent / 'metrics')
m.mkdir(parents=True, exist_ok=True)
(m / 'metrics.jsonl').write_text(sys.argv[1])
print('token', os.environ['TRAINYARD_TOKEN'], flush=True)
(ck / 'ready').write_text('')
time.sleep(120)
"""


@pytest.fixture
def plane(tmp_path):
    p = Plane(tmp_path / "yard")
    yield p
    p.stop()


def test_hostile_figures_from_a_job_never_break_a_page_or_a_response(plane):
    p = plane
    j = p.submit(command=[*script(JOB), "\n".join(LINES) + "\n"], team="vision")["id"]
    p.wait(j, "RUNNING")
    jd = job_dir(p.cp.data_dir, j)
    deadline = time.monotonic() + 30
    while not (jd / "checkpoints" / "ready").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    token = re.search(r"^token (\S+)$", (jd / "logs" / "rank-0.log").read_text(), re.M).group(1)
    job = p.client(token)
    report = {"attempt": 1, "step": 10, "time": time.time()}
    r = job.post(f"/api/v1/jobs/{j}/progress", json={**report, "metrics": {"loss": HUGE}})
    assert r.status_code == 200 and r.json()["accepted"], r.text
    assert p.admin.get("/ui/").status_code == 200 and p.job(j)["progress"]["metrics"] == {"loss": None}
    r = job.post(f"/api/v1/jobs/{j}/progress", json={**report, "metrics": {"loss": 1e308, "tokens": HUGE, "lr": -1e308}})
    assert r.status_code == 200 and r.json()["accepted"], r.text
    for bad in ('"metrics": {"loss": NaN}', '"metrics": {"loss": -Infinity}', '"metrics": {"loss": 1e999}'):
        r = job.post(f"/api/v1/jobs/{j}/progress", content=f'{{"attempt": 1, "step": 11, "time": 1.0, {bad}}}',
                     headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["field"] == "metrics.loss", r.text  # NaN is not JSON

    for path in ("/ui/", f"/ui/jobs/{j}", f"/api/v1/jobs/{j}", "/api/v1/jobs", f"/api/v1/jobs/{j}/events", "/metrics"):
        r = p.admin.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text[-500:])
    progress = p.job(j)["progress"]
    assert progress["metrics"] == {"loss": 1e308, "tokens": None, "lr": -1e308}  # no reader chokes on 400 digits
    page = p.admin.get(f"/ui/jobs/{j}").text
    svg = re.search(r'<svg id="loss-curve"[^>]*>', page).group(0)
    assert 'data-steps="1,9,10"' in svg and 'data-values="2.5,5e-324,1.5"' in svg, svg
    assert "7 non-finite values not drawn (first at step 2)" in page  # steps 2-8: nothing a scale holds
    assert "1.00e+308" in p.admin.get("/ui/").text  # the overview's loss column
    p.admin.post(f"/api/v1/jobs/{j}/cancel")


@pytest.mark.parametrize("ys", [
    [1.0, 1e308], [-1e308, 1e308], [0.0, 5e-324], [1e-320, 2e-320], [1.0, 1.7976931348623157e308],
    [1.0, float("nan"), float("inf"), -float("inf"), 2.0], [HUGE, 1.0, -HUGE], [1e300, -1e300], [5e-324],
])
def test_a_chart_of_any_numbers_has_finite_geometry(ys):
    c = charts.line_chart("t", [charts.Series("s", list(enumerate(ys)))])
    coords = [float(v) for _, pts, _ in c.lines for pt in pts.split() for v in pt.split(",")]
    coords += [v for _, x, y, _ in c.dots for v in (x, y)] + [px for px, _ in c.y_ticks + c.x_ticks]
    assert all(math.isfinite(v) for v in coords), c
    assert c.empty or c.lines or c.dots


@pytest.mark.parametrize("v, shown", [
    (1e308, "1.00e+308"), (-1e400, "-inf"), (float("nan"), "nan"), (HUGE, "—"), (5e-324, "4.9e-324"), (2.5e7, "25M"),
], ids=["1e308", "-1e400", "nan", "400-digits", "subnormal", "25M"])
def test_numbers_are_formatted_whatever_they_are(v, shown):
    assert charts.fmt_number(v) == shown


def test_finite_takes_only_numbers_a_scale_can_hold():
    assert [figures.finite(v) for v in (1, 2.5, True, "1", None, HUGE, 1e301, -1e300, float("nan"))] == \
        [1.0, 2.5, None, None, None, None, None, -1e300, None]
    assert [figures.step(v) for v in (0, 5, -1, True, 2**62, 2**62 + 1, 1.0)] == [0, 5, None, None, 2**62, None, None]
    assert [figures.json_number(v) for v in (float("inf"), 2**63, -(2**63), 1e308, "x", False)] == \
        [None, None, -(2**63), 1e308, "x", False]


def test_step_records_a_job_made_up_never_stall_the_loop(plane):
    # The plane reads the attempt's last step records when it ends (the work lost since the last
    # checkpoint): a `time` of "x" raised in every reconcile pass, so no attempt anywhere ended.
    body = """
import json, os, pathlib
ck = pathlib.Path(os.environ['TRAINYARD_CHECKPOINT_DIR'])
m = pathlib.Path(os.environ.get('TRAINYARD_METRICS_DIR') or ck.parent / 'metrics')
m.mkdir(parents=True, exist_ok=True)
bad = [{'step': 1, 'time': 1e308, 'attempt': 1, 'step_time_s': 1e308}, {'step': 'x', 'time': 1.0, 'attempt': 1},
       {'step': 2, 'time': 'x', 'attempt': 1}]
(m / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\\n' for r in bad))
os.kill(os.getpid(), 9)  # a crash: its lost work is counted
"""
    j = plane.submit(command=script(body), team="vision")["id"]
    deadline = time.monotonic() + 60
    while not [e for e in plane.admin.get(f"/api/v1/jobs/{j}/events").json()["events"] if e["kind"] == "job.failed"]:
        assert plane.cp.loop.stats.errors == 0, plane.cp.loop.stats.last_error
        assert time.monotonic() < deadline, plane.job(j)
        time.sleep(0.1)
    assert plane.cp.loop.stats.errors == 0, plane.cp.loop.stats.last_error
    p = plane.admin.get(f"/api/v1/jobs/{j}").json()
    assert 0 <= p["lost_gpu_s"] < 120, p  # at most the wall time of the attempt, never 1e308
    plane.admin.post(f"/api/v1/jobs/{j}/cancel")
