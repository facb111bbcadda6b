"""Retention (services/retention.py, control/lifecycle/retention.py): finished jobs past the configured time
are purged in bounded batches with their attempts and events (one `retention.deleted` event per
job dir that goes), audit events are kept, the
Prometheus counters do not move, and a directory-only horizon leaves the accounting whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from tests.plane import TWO_TEAMS, Plane
from tests.services.acct_history import NOW, T0, H, History
from trainyard.contracts import JobDir
from trainyard.services.events import record
from trainyard.services.metrics import CARRIED
from trainyard.store.models import AttemptRow, EventRow, JobRow


def plane_with(tmp_path: Path, retention: str) -> Plane:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(TWO_TEAMS.read_text() + retention)
    p = Plane(tmp_path / "yard", config=cfg, start=False)
    p.cp.clock = lambda: NOW
    p.cp.retention.clock = lambda: NOW
    return p


def carried_samples(p: Plane) -> dict:
    text = p.admin.get("/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in text_string_to_metric_families(text)
            if fam.name in CARRIED for s in fam.samples}


def count(p: Plane, model, *where) -> int:  # noqa: ANN001
    with p.cp.store.session() as s:
        return s.scalar(select(func.count()).select_from(model).where(*where))


@pytest.fixture
def purging(tmp_path):
    # jobs that ended more than an hour before NOW (T0 + 4h) go; batches of 2
    p = plane_with(tmp_path, "retention: {jobs: 1h, batch: 2}\n")
    h = History(p)
    for jid in (h.early, h.preempted, h.oom, h.late):
        JobDir.of(p.cp.data_dir, jid).root.mkdir(parents=True)
    with p.cp.store.session.begin() as s:
        record(s, "alice", "job.held", "held by alice", job_id=h.early, at=T0 + 0.1 * H)  # audited
        record(s, "scheduler", "job.started", "attempt 1 started", job_id=h.early, at=T0)  # not audited
    yield p, h
    p.cp.stop()


def test_old_finished_jobs_go_in_batches_and_the_counters_stay(purging):
    p, h = purging
    before = carried_samples(p)
    assert p.cp.retention.run_once(max_batches=1) == 2  # one batch: the two oldest due
    assert count(p, JobRow) == 4
    assert p.cp.retention.run_once() == 1  # then the rest: early, preempted and oom ended before 3h
    gone = (h.early, h.preempted, h.oom)
    kept = {h.running, h.pending, h.late}
    with p.cp.store.session() as s:
        assert set(s.scalars(select(JobRow.id))) == kept
    assert count(p, AttemptRow, AttemptRow.job_id.in_(gone)) == 0
    assert count(p, EventRow, EventRow.job_id == h.early, EventRow.kind == "job.started") == 0
    assert count(p, EventRow, EventRow.job_id == h.early, EventRow.kind == "job.held") == 1  # the audit trail stays
    assert all(not JobDir.of(p.cp.data_dir, j).root.exists() for j in gone)
    assert JobDir.of(p.cp.data_dir, h.late).root.exists()
    assert carried_samples(p) == pytest.approx(before)  # no counter or histogram went down
    purges = p.admin.get("/api/v1/audit", params={"since": f"@{T0}", "until": f"@{NOW + 1}",
                                                  "kind": "retention.purged"}).json()["events"]
    assert sum(e["data"]["jobs"] for e in purges) == 3 and len(purges) == 2
    deleted = p.admin.get("/api/v1/audit", params={"since": f"@{T0}", "until": f"@{NOW + 1}",
                                                   "kind": "retention.deleted"}).json()["events"]
    # one event per job dir that went, with its bytes (an empty dir: its own size) and the rule
    assert sorted((e["job_id"], e["data"]["what"], e["data"]["rule"]) for e in deleted) == sorted(
        (j, "job_dir", "retention.jobs") for j in gone)
    assert all(e["data"]["bytes"] > 0 and e["data"]["complete"] for e in deleted)
    assert [n for n in os.listdir(p.cp.data_dir / "jobs")] == [JobDir.of(p.cp.data_dir, h.late).root.name]
    assert p.cp.retention.run_once() == 0  # nothing more is due


def test_a_directory_horizon_keeps_the_accounting(tmp_path):
    p = plane_with(tmp_path, "retention: {job_dirs: 2h}\n")
    try:
        h = History(p)
        for jid in (h.early, h.late):
            JobDir.of(p.cp.data_dir, jid).root.mkdir(parents=True)
        window = {"starttime": f"@{T0}", "endtime": f"@{NOW}"}
        before = p.admin.get("/api/v1/acct/jobs", params=window).json()["jobs"]
        p.cp.retention.run_once()
        assert not JobDir.of(p.cp.data_dir, h.early).root.exists()
        assert JobDir.of(p.cp.data_dir, h.late).root.exists()  # ended 0.3h before NOW: kept
        assert p.admin.get("/api/v1/acct/jobs", params=window).json()["jobs"] == before
    finally:
        p.cp.stop()


def test_nothing_is_purged_by_default(tmp_path):
    p = Plane(tmp_path / "yard", start=False)
    p.cp.clock = p.cp.retention.clock = lambda: NOW
    try:
        History(p)
        assert p.cp.retention.run_once() == 0 and count(p, JobRow) == 6
    finally:
        p.cp.stop()


def test_a_bad_retention_is_refused_naming_the_field(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(TWO_TEAMS.read_text() + "retention: {jobs: forever}\n")
    with pytest.raises(Exception, match="retention"):
        Plane(tmp_path / "yard", config=cfg, start=False)
