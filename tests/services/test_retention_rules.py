"""Lifecycle rules for logs and job dirs (services/retention.py, control/lifecycle/retention.py): per
team and class over the cluster's, `retention.job_dirs` the fallback; each deletion one audit
event naming the job, what, its bytes and the rule; a running job is never touched, and a job
that ends after the thread's cursor passed its id is still reached."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import select, update

from tests.plane import TWO_TEAMS, Plane
from tests.services.acct_history import NOW, T0, H, Try, add_job
from trainyard.contracts import JobDir
from trainyard.store.models import EventRow, JobRow

RULES = (TWO_TEAMS.read_text()
         .replace("  - name: vision\n", "  - name: vision\n    storage: {lifecycle: {logs: 1h}}\n", 1)
         .replace("  - name: nlp\n", "  - name: nlp\n    storage: {lifecycle: {job_dirs: 2h}}\n", 1)
         .replace("  - {name: batch, ", "  - {name: batch, lifecycle: {job_dirs: 30m}, ", 1)
         + "retention: {job_dirs: 3h}\n")


def apparent(path: Path) -> int:
    """`du -sbx`: st_size of the top and of every entry below it, hard links once, no link followed."""
    seen, total = set(), os.lstat(path).st_size
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            st = os.lstat(os.path.join(root, n))
            if st.st_nlink > 1 and (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def fill(p: Plane, jid: int, outside: Path) -> Path:
    with p.cp.store.session() as s:
        key = s.scalar(select(JobRow.dir_key).where(JobRow.id == jid))
    root = JobDir.of(p.cp.data_dir, jid, key).root
    (root / "logs").mkdir(parents=True)
    (root / "checkpoints" / "step-1").mkdir(parents=True)
    (root / "metrics").mkdir()
    (root / "logs" / "rank-0.log").write_bytes(b"x" * (1000 + jid))
    (root / "logs" / "escape").symlink_to(outside)  # unlinked, never followed
    (root / "checkpoints" / "step-1" / "w.pt").write_bytes(b"w" * 5000)
    (root / "metrics" / "metrics.jsonl").write_text('{"step": 1}\n')
    (root / "script.sh").write_text("#!/bin/sh\ntrue\n")
    return root


@pytest.fixture
def plane(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(RULES)
    p = Plane(tmp_path / "yard", config=cfg, start=False)
    p.cp.clock = p.cp.retention.clock = lambda: NOW
    yield p
    p.cp.stop()


def test_each_rule_deletes_what_it_says_with_one_audit_event_each_and_a_running_job_is_untouched(plane, tmp_path):
    p = plane
    outside = tmp_path / "not-the-jobs"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    running = add_job(p, name="running", team="nlp", state="RUNNING", tries=(Try(0.1 * H, None),))
    a = add_job(p, name="a", tries=(Try(0, 0.5 * H),))  # vision training, ended 3.5h ago: retention.job_dirs (3h)
    b = add_job(p, name="b", tries=(Try(0, 2 * H),))  # vision, ended 2h ago: its logs (1h), its dir stays
    c = add_job(p, name="c", team="nlp", tries=(Try(0, 2.5 * H),))  # nlp, ended 1.5h ago: nothing yet (2h)
    d = add_job(p, name="d", team="nlp", tries=(Try(0, 1 * H),))  # nlp, ended 3h ago: its dir (team's 2h)
    f = add_job(p, name="f", job_class="batch", tries=(Try(3 * H, 3.4 * H),))  # batch, 0.6h ago: class's 30m
    dirs = {j: fill(p, j, outside) for j in (running, a, b, c, d, f)}
    sizes = {j: apparent(r) for j, r in dirs.items()}
    b_logs = apparent(dirs[b] / "logs")

    p.cp.retention.run_once()

    assert not dirs[a].exists() and not dirs[d].exists() and not dirs[f].exists()
    assert dirs[b].exists() and not (dirs[b] / "logs").exists() and (dirs[b] / "checkpoints" / "step-1").is_dir()
    assert apparent(dirs[c]) == sizes[c] and apparent(dirs[running]) == sizes[running]  # untouched
    assert (outside / "keep.txt").read_text() == "mine"
    events = p.admin.get("/api/v1/audit", params={"since": f"@{T0}", "until": f"@{NOW + 1}",
                                                  "kind": "retention.deleted"}).json()["events"]
    got = {(e["job_id"], e["data"]["what"], e["data"]["bytes"], e["data"]["rule"]) for e in events}
    assert got == {(a, "job_dir", sizes[a], "retention.job_dirs"),
                   (b, "logs", b_logs, "teams.vision.storage.lifecycle.logs"),
                   (d, "job_dir", sizes[d], "teams.nlp.storage.lifecycle.job_dirs"),
                   (f, "job_dir", sizes[f], "classes.batch.lifecycle.job_dirs")}
    assert len(events) == 4 and p.cp.retention.deleted == 4

    p.cp.retention.run_once()  # nothing more is due: no second event
    with p.cp.store.session() as s:
        assert len(s.scalars(select(EventRow.id).where(EventRow.kind == "retention.deleted")).all()) == 4

    # the running job (the lowest id, below the cursor now) ends long ago: the next pass reaches it
    with p.cp.store.session.begin() as s:
        s.execute(update(JobRow).where(JobRow.id == running).values(state="COMPLETED", end_time=T0 + 0.2 * H))
    p.cp.retention.run_once()
    assert not dirs[running].exists()
    with p.cp.store.session() as s:
        e = s.scalars(select(EventRow).where(EventRow.kind == "retention.deleted", EventRow.job_id == running)).one()
        assert e.data["bytes"] == sizes[running] and e.data["rule"] == "teams.nlp.storage.lifecycle.job_dirs"


def test_a_job_that_is_no_longer_finished_when_its_deletion_is_recorded_is_left(plane, tmp_path):
    p = plane
    jid = add_job(p, name="a", team="nlp", tries=(Try(0, 0.5 * H),))
    root = fill(p, jid, tmp_path)
    from trainyard.services import retention

    with p.cp.store.session() as s:
        items, _ = retention.due(s, p.cp.data_dir, p.cp.configs.current(s).spec, NOW, 0, 100)
    assert [d.job_id for d in items] == [jid]
    with p.cp.store.session.begin() as s:  # requeued meanwhile (an admin's `yard requeue`)
        s.execute(update(JobRow).where(JobRow.id == jid).values(state="PENDING"))
    with p.cp.store.session.begin() as s:
        assert retention.record_deletion(s, p.cp.data_dir, items[0], 1, True, NOW) is None
    assert root.exists()


def test_what_a_crash_left_moved_aside_is_removed_at_the_next_pass(plane, tmp_path):
    p = plane
    jid = add_job(p, name="a", team="nlp", tries=(Try(0, 0.5 * H),))
    root = fill(p, jid, tmp_path)
    from trainyard.services import retention

    with p.cp.store.session() as s:
        [item], _ = retention.due(s, p.cp.data_dir, p.cp.configs.current(s).spec, NOW, 0, 100)
    with p.cp.store.session.begin() as s:  # recorded and moved aside, then the plane died
        trash = retention.record_deletion(s, p.cp.data_dir, item, apparent(root), True, NOW)
    assert trash is not None and not root.exists() and (p.cp.data_dir / "jobs" / trash).is_dir()
    p.cp.retention.run_once()
    assert not (p.cp.data_dir / "jobs" / trash).exists() and list((p.cp.data_dir / "jobs").iterdir()) == []
    with p.cp.store.session() as s:  # one event: the deletion was recorded once
        assert len(s.scalars(select(EventRow.id).where(EventRow.kind == "retention.deleted")).all()) == 1
