"""services/telemetry.py's read side for `yard acct` (issue 39): the attempts' `gpu_summary`s summed up
(mean weighted by readings, peaks), through `/api/v1/acct/jobs` and `/acct/attempts` and the CLI's
gpuutil, gpuutilmax and gpumem columns."""

from __future__ import annotations

import time

import pytest

from tests.api.test_job_gpus import periods
from tests.control.lifecycle.test_telemetry import running_attempt
from tests.plane import Plane
from trainyard.cli.acct import BY_NAME
from trainyard.services.telemetry import acct_figures


def test_acct_figures_weigh_the_mean_by_readings_and_keep_the_peaks():
    a = {"node-0/0": {"util_mean": 90.0, "util_peak": 100.0, "mem_peak_mib": 500.0, "samples": 3},
         "node-0/1": {"util_mean": 10.0, "util_peak": 20.0, "mem_peak_mib": 7000.0, "samples": 1}}
    b = {"node-1/0": {"util_mean": 50.0, "util_peak": 60.0, "mem_peak_mib": 100.0, "samples": 4}}
    assert acct_figures([a, None, b]) == {"gpu_util_mean": 60.0, "gpu_util_peak": 100.0, "gpu_mem_peak_mib": 7000.0}
    assert acct_figures([None, {}]) == {"gpu_util_mean": None, "gpu_util_peak": None, "gpu_mem_peak_mib": None}


@pytest.fixture
def plane(tmp_path):
    p = Plane(tmp_path / "yard", start=False)
    yield p
    p.cp.stop()


def test_acct_shows_the_jobs_gpu_figures(plane):
    now = time.time()
    jid, _ = running_attempt(plane, [{"node": "node-0", "gpus": [0, 1], "mem_mib": 0}], started_at=now - 60)
    periods(plane, jid, now - 15, (30.0, 70.0))
    idle, _ = running_attempt(plane, [{"node": "node-1", "gpus": [0], "mem_mib": 0}], started_at=now - 60)
    jobs = {j["id"]: j for j in plane.admin.get("/api/v1/acct/jobs", params={"start": "now-1hour"}).json()["jobs"]}
    got = jobs[jid]
    assert (got["gpu_util_mean"], got["gpu_util_peak"], got["gpu_mem_peak_mib"]) == (50.0, 70.0, 2000.0)
    assert jobs[idle]["gpu_util_mean"] is None  # never read: empty, not 0
    att = plane.admin.get("/api/v1/acct/attempts", params={"start": "now-1hour"}).json()["attempts"]
    assert next(a for a in att if a["job_id"] == jid)["gpu_util_peak"] == 70.0
    show = {name: BY_NAME[name].show for name in ("gpuutil", "gpuutilmax", "gpumem")}
    assert [show[n](got) for n in show] == ["50.0%", "70.0%", "2000M"]
    assert [show[n](jobs[idle]) for n in show] == ["", "", ""]
