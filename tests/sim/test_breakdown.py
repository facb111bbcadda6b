"""Per team and per class figures of a replay (`sim/breakdown.py`), on a hand-made result."""

from __future__ import annotations

import pytest

from trainyard.sched.cluster import Node
from trainyard.sched.types import JobClass, Quota, Team
from trainyard.sim.breakdown import breakdown
from trainyard.sim.result import JobRecord, SimResult
from trainyard.sim.workload import Workload


def test_each_team_and_class_gets_its_waits_share_and_losses() -> None:
    w = Workload(nodes=[Node("n0", 4)],
                 teams={"a": Team("a", "lab", {"default": Quota(3)}), "b": Team("b", "lab", {"default": Quota(1)})},
                 classes={"training": JobClass("training", 200, True), "batch": JobClass("batch", 100, True)}, jobs=[])
    jobs = [JobRecord(1, "a", "training", 2, 0.0, 100.0, first_start=0.0, end=100.0),
            JobRecord(2, "a", "batch", 2, 0.0, 50.0, first_start=100.0, end=200.0, wait_s=100.0, preemptions=1,
                      lost_gpu_s=7200.0),
            JobRecord(3, "b", "batch", 1, 10.0, 10.0, wait_s=190.0)]  # never finished
    res = SimResult("trainyard", 4, 0.0, 10.0, jobs, team_series={"a": [(0.0, 0), (0.0, 2), (100.0, 2), (200.0, 0)]},
                    end_time=200.0)
    out = breakdown(res, w)
    a, b = out["teams"]["a"], out["teams"]["b"]
    assert (a["jobs"], a["completed"], a["mean_wait_s"], a["mean_jct_s"], a["preemptions"]) == (2, 2, 50.0, 150.0, 1)
    assert a["p99_wait_s"] == pytest.approx(99.0) and a["lost_gpu_hours"] == 2.0
    assert a["busy_gpu_hours"] == round(400 / 3600, 3) and a["gpu_share"] == 0.5 and a["quota_share"] == 0.75
    assert (b["jobs"], b["completed"], b["mean_jct_s"], b["gpu_share"], b["quota_share"]) == (1, 0, 0.0, 0.0, 0.25)
    batch = out["classes"]["batch"]
    assert (batch["jobs"], batch["completed"], batch["mean_wait_s"]) == (2, 1, 145.0)
    assert batch["busy_gpu_hours"] == round((50 * 2 + 7200) / 3600, 3)  # completed jobs: work and losses
    assert "quota_share" not in batch
