"""The runtime's side of checkpoint tiers (issue 41): under the plane's rules
(`TRAINYARD_CHECKPOINT_RETENTION=plane`) no committed step is deleted by the runtime, otherwise its
own keep_last/keep_every hold as before; every manifest carries the metrics of the last step logged
before its save (`manifest_metrics`: finite numbers only)."""

from __future__ import annotations

import json
import math

import pytest

from tests.runtime.test_checkpoint import make, train
from trainyard.contracts import CHECKPOINT_MARKER, PLANE_RETENTION, JobVar, committed_steps
from trainyard.runtime.run import manifest_metrics

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def test_under_the_planes_rules_the_runtime_deletes_no_committed_step(tmp_path, monkeypatch):
    monkeypatch.setenv(JobVar.CHECKPOINT_RETENTION, PLANE_RETENTION)
    mgr, *state = make(tmp_path, keep_last=2, keep_every=4)
    for step in range(1, 8):
        train(*state)
        mgr.metrics.update(loss=10.0 - step)
        mgr.save(step)
    mgr.wait()
    assert [s for s, _ in committed_steps(tmp_path)] == list(range(1, 8))
    for step in range(1, 8):  # the metrics as they were when each save began (async saves)
        m = json.loads((tmp_path / f"step-{step}" / CHECKPOINT_MARKER).read_text())
        assert m["metrics"] == {"loss": 10.0 - step}


def test_otherwise_its_own_retention_holds(tmp_path, monkeypatch):
    monkeypatch.delenv(JobVar.CHECKPOINT_RETENTION, raising=False)
    mgr, *state = make(tmp_path, keep_last=2, keep_every=4)
    for step in range(1, 8):
        train(*state)
        mgr.save(step, blocking=True)
    assert [s for s, _ in committed_steps(tmp_path)] == [4, 6, 7]
    assert json.loads((tmp_path / "step-7" / CHECKPOINT_MARKER).read_text())["metrics"] == {}


def test_manifest_metrics_keeps_finite_numbers_only():
    got = manifest_metrics({"loss": 1.25, "lr": 3e-4, "steps": 7, "nan": math.nan, "inf": math.inf, "name": "x",
                            "flag": True, "none": None})
    assert got == {"loss": 1.25, "lr": 3e-4, "steps": 7.0}
