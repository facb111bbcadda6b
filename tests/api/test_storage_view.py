"""`GET /api/v1/storage` per tier and kind, what the rules delete next, and an admin's refresh
(services/storage_view.py): the fast tier's kinds from the meter's walk (apparent sizes, to the
byte), the archive from the `checkpoint_copies` rows, the datasets cache from the `node_datasets`
rows charged to the dataset's team, and the next deletions: checkpoints from the plan, logs and job
dirs from their due dates. The existing fields stay (tests/control/lifecycle/test_storage.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from tests.plane import TWO_TEAMS, Plane
from tests.services.acct_history import NOW, T0, H, Try, add_job
from tests.services.test_retention_rules import apparent
from trainyard.contracts import JobDir
from trainyard.store.models import CheckpointCopyRow, CheckpointKeepRow, DatasetRow, JobRow, NodeDatasetRow

CONFIG = (TWO_TEAMS.read_text()
          .replace("  - name: vision\n", "  - name: vision\n    storage: {lifecycle: {logs: 1h, "
                   "checkpoints: {keep_last: 2, keep_every: 5}}}\n", 1)
          + "storage: {interval: 1h, archive: {url: /srv/archive}, lifecycle: {job_dirs: 10h}}\n")


@pytest.fixture
def plane(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CONFIG)
    p = Plane(tmp_path / "yard", config=cfg, start=False)
    p.cp.clock = lambda: NOW
    yield p
    p.cp.stop()


def make_dir(p: Plane, jid: int, files: dict[str, int]) -> JobDir:
    with p.cp.store.session() as s:
        jd = JobDir.of(p.cp.data_dir, jid, s.scalar(select(JobRow.dir_key).where(JobRow.id == jid)))
    for rel, n in files.items():
        (jd.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (jd.root / rel).write_bytes(b"z" * n)
    return jd


def team(rep: dict, name: str) -> dict:
    return next(t for t in rep["teams"] if t["team"] == name)


def test_tiers_kinds_and_the_next_deletions(plane):
    p = plane
    ended = add_job(p, name="ended", tries=(Try(0, 2 * H),))  # vision, ended 2h before NOW
    running = add_job(p, name="running", team="nlp", state="RUNNING", tries=(Try(H, None),))
    jd = make_dir(p, ended, {"logs/rank-0.log": 700, "checkpoints/step-9/w": 9000, "checkpoints/step-10/w": 10_000,
                             "metrics/metrics.jsonl": 50, "script.sh": 20})
    make_dir(p, running, {"logs/rank-0.log": 300, "checkpoints/step-1/w": 100})
    with p.cp.store.session.begin() as s:
        for step in range(1, 11):  # the tiers thread's rows: 9, 10 fast; 5 archived; 1-4, 6-8 still fast
            tier = "archive" if step == 5 else "fast"
            s.add(CheckpointCopyRow(job_id=ended, step=step, tier=tier, bytes=1000 * step, files=1, at=T0))
        s.add(CheckpointKeepRow(job_id=ended, step=3, by="alice", at=T0))  # marked keep: never deleted
        s.add(CheckpointCopyRow(job_id=running, step=1, tier="archive", bytes=77, files=1, at=T0))
        s.add(DatasetRow(name="corpus", version="v1", team="nlp", source="/data/corpus", checksum="sha256:" + "a" * 64,
                         bytes=4096, files=1, grants=["vision"], added_by="bob", added_at=T0))
        for node in ("node-0", "node-1"):
            s.add(NodeDatasetRow(node=node, checksum="sha256:" + "a" * 64, name="corpus", version="v1", bytes=4096,
                                 staged_at=T0, last_used_at=T0))

    rep = p.admin.post("/api/v1/storage/refresh", params={"jobs": 5}).json()
    vision, nlp = team(rep, "vision"), team(rep, "nlp")
    assert {"bytes", "quota_bytes", "jobs", "complete", "over"} <= set(vision)  # the fields before stay
    fast = vision["tiers"]["fast"]
    assert fast["apparent_bytes"] == apparent(jd.root) == sum(fast["kinds"].values())
    assert fast["kinds"]["logs"] == apparent(jd.logs)
    assert fast["kinds"]["checkpoints"] == apparent(jd.root / "checkpoints")
    assert fast["kinds"]["metrics"] == apparent(jd.root / "metrics")
    assert vision["tiers"]["archive"] == {"bytes": 5000, "checkpoints": 1}
    assert nlp["tiers"]["archive"] == {"bytes": 77, "checkpoints": 1}
    assert nlp["tiers"]["datasets"] == {"bytes": 8192, "copies": 2} and vision["tiers"]["datasets"]["bytes"] == 0
    gauges = dict(line.rsplit(" ", 1) for line in p.admin.get("/metrics").text.splitlines()
                  if line.startswith(("trainyard_team_archive_bytes", "trainyard_team_dataset_cache_bytes")))
    assert {k: float(v) for k, v in gauges.items()} == {  # the same figures, for Prometheus
        'trainyard_team_archive_bytes{team="vision"}': 5000.0, 'trainyard_team_archive_bytes{team="nlp"}': 77.0,
        'trainyard_team_dataset_cache_bytes{team="nlp"}': 8192.0}

    nxt = rep["next"]
    ckpt = sorted(n["step"] for n in nxt if n["what"] == "checkpoint")
    assert ckpt == [1, 2, 4, 6, 7, 8]  # keep-last-2 + every-5th: 9, 10 fast, 5 archive; 3 is marked keep
    assert all(n["at"] == NOW and n["job_id"] == ended and "keep_last=2" in n["rule"] for n in nxt
               if n["what"] == "checkpoint")
    logs = next(n for n in nxt if n["what"] == "logs")
    assert (logs["job_id"], logs["bytes"], logs["at"], logs["rule"]) == (
        ended, apparent(jd.logs), T0 + 3 * H, "teams.vision.storage.lifecycle.logs")
    jdir = next(n for n in nxt if n["what"] == "job_dir")
    assert (jdir["job_id"], jdir["bytes"], jdir["at"], jdir["rule"]) == (
        ended, apparent(jd.root), T0 + 12 * H, "storage.lifecycle.job_dirs")
    assert not any(n["job_id"] == running for n in nxt)  # a running job's files have no date
    assert [n["at"] for n in nxt] == sorted(n["at"] for n in nxt)
    assert len(p.admin.get("/api/v1/storage", params={"next": 2}).json()["next"]) == 2
    # a purge of the rows sooner than the dir rule: the dir goes with them, under that rule
    text = CONFIG.replace("storage: {interval: 1h,", "retention: {jobs: 5h}\nstorage: {interval: 1h,")
    assert p.admin.post("/api/v1/cluster/config", json={"text": text}).status_code in (200, 201)
    jdir = next(n for n in p.admin.get("/api/v1/storage").json()["next"] if n["what"] == "job_dir")
    assert (jdir["at"], jdir["rule"]) == (T0 + 7 * H, "retention.jobs")


def test_refresh_is_an_admins_and_reading_is_a_readers(plane):
    p = plane
    viewer = p.as_user("carol", "viewer")
    assert viewer.get("/api/v1/storage").status_code == 200
    assert viewer.post("/api/v1/storage/refresh").status_code == 403
    assert p.admin.get("/api/v1/storage", params={"next": -1}).status_code == 422
