"""`GET /api/v1/jobs/{id}/gpus` and the job page's GPU plots (issue 39, per-GPU telemetry): the stored
rows as one series per attempt and GPU, with the attempts' summaries; who may read the job may read
them; an unknown or malformed job id is a 4xx; the page draws one line per GPU with the API's values."""

from __future__ import annotations

import re
import time

import pytest

from tests.api.test_dashboard_routes import browser
from tests.control.lifecycle.test_telemetry import running_attempt
from tests.plane import Plane
from trainyard.services import telemetry


@pytest.fixture
def plane(tmp_path):
    p = Plane(tmp_path / "yard", start=False)
    yield p
    p.cp.stop()


def periods(p: Plane, job_id: int, t: float, utils: tuple[float, float]) -> None:
    ps = []
    for gpu, u in enumerate(utils):
        one = telemetry.Period(job_id, 1, "node-0", gpu, t - 15, t, "emulated")
        one.add(u, 1000.0 * (gpu + 1), 200.0, 50.0, t)
        ps.append(one)
    with p.cp.transaction() as s:
        telemetry.flush(s, ps, t, 2000)


def test_the_series_per_gpu_and_the_summary(plane):
    jid, _ = running_attempt(plane, [{"node": "node-0", "gpus": [0, 1], "mem_mib": 0}])
    for i in range(3):
        periods(plane, jid, 2000.0 + 15 * i, (10.0 * i, 90.0))
    r = plane.admin.get(f"/api/v1/jobs/{jid}/gpus")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["fields"] == ["time", "period_s", "util", "util_peak", "mem_mib", "power_w", "temp_c"]
    assert [(g["attempt"], g["node"], g["gpu"], g["source"]) for g in body["gpus"]] == \
        [(1, "node-0", 0, "emulated"), (1, "node-0", 1, "emulated")]
    assert [pt[2] for pt in body["gpus"][0]["points"]] == [0.0, 10.0, 20.0]
    assert [pt[0] for pt in body["gpus"][1]["points"]] == [2000.0, 2015.0, 2030.0]
    assert body["summary"]["1"]["node-0/0"] == {"util_mean": 10.0, "util_peak": 20.0, "mem_peak_mib": 1000.0,
                                                "samples": 3}
    member = plane.as_user("nora", "member", "nlp")  # another team's member sees job metadata, as /jobs/{id}
    assert member.get(f"/api/v1/jobs/{jid}/gpus").status_code == 200


@pytest.mark.parametrize("path, status", [("/api/v1/jobs/999999/gpus", 404), ("/api/v1/jobs/x/gpus", 422),
                                          ("/api/v1/jobs/-1/gpus", 422)])
def test_an_unknown_or_malformed_job_is_refused(plane, path, status):
    assert plane.admin.get(path).status_code == status


def test_the_job_page_draws_a_line_per_gpu_with_the_apis_values(plane):
    jid, _ = running_attempt(plane, [{"node": "node-0", "gpus": [0, 1], "mem_mib": 0}])
    c = browser(plane, plane.admin_token)
    assert 'id="gpu-util-empty"' in c.get(f"/ui/jobs/{jid}").text  # nothing read yet: says so
    now = time.time()
    for i in range(3):
        periods(plane, jid, now - 45 + 15 * i, (10.0 * i, 90.0))
    html = c.get(f"/ui/jobs/{jid}").text
    svg = re.search(r'<svg id="gpu-util"[^>]*>', html)
    assert svg is not None, html
    assert 'data-series="node-0/0|node-0/1"' in svg.group(0)
    assert 'data-values="0,10,20;90,90,90"' in svg.group(0)
    util = html[html.index('id="gpu-util"'):html.index('id="gpu-mem"')]
    assert util.count('<polyline class="line') == 2
    assert 'data-values="1000,1000,1000;2000,2000,2000"' in html  # memory
