"""The storage meter (`control/lifecycle/storage.py`) on real files and a real store: what it counts (allocated
blocks, hard links once, never through a link), a walk cut at its deadline, the team's quota and
its events (once per crossing, read back after a restart), and the reserve. The loop and real
accounts are in tests/security/test_disk_quota.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.plane import TWO_TEAMS, Plane, identity_config_text
from trainyard.contracts import JobDir
from trainyard.control.lifecycle.storage import StorageMeter
from trainyard.states import JobState
from trainyard.store.models import EventRow, JobRow

MiB = 1 << 20
STORAGE = """
storage:
  quota_gb: 0.5             # 512 MiB: nlp's
  interval: 1h              # the tests sweep by hand
"""


def with_vision_quota(text: str, gb: float) -> str:
    return text.replace("  - name: vision\n", f"  - name: vision\n    storage: {{quota_gb: {gb}}}\n", 1)


@pytest.fixture
def plane(tmp_path):
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(with_vision_quota(TWO_TEAMS.read_text(), 2 / 1024) + STORAGE)  # vision: 2 MiB
    p = Plane(tmp_path / "yard", config=cfg, start=False)
    yield p
    p.cp.stop()


def job_with_dir(p: Plane, team: str) -> JobDir:
    """A held job of `team` and its directory, made as a launch would (empty but for its dirs)."""
    jid = p.submit(team=team, command=["true"], hold=True)["id"]
    with p.cp.store.session() as s:
        jd = JobDir.of(p.cp.data_dir, jid, s.get(JobRow, jid).dir_key)
    for d in ("logs", "checkpoints", "metrics"):
        (jd.root / d).mkdir(parents=True)
    return jd


def write(path: Path, n: int) -> None:
    path.write_bytes(os.urandom(n))


def events(p: Plane, kind: str) -> list[EventRow]:
    with p.cp.store.session() as s:
        return list(s.query(EventRow).filter_by(kind=kind).order_by(EventRow.id))


def spec(p: Plane):  # noqa: ANN201 - the ConfigSpec in force
    with p.cp.store.session() as s:
        return p.cp.configs.current(s).spec


def team(rep: dict, name: str | None) -> dict:
    return next(t for t in rep["teams"] if t["team"] == name)


def test_each_team_is_charged_what_its_job_dirs_hold_hard_links_once_and_no_link_followed(plane, tmp_path):
    p, meter = plane, plane.cp.storage
    v, n = job_with_dir(p, "vision"), job_with_dir(p, "nlp")
    write(v.checkpoints / "model.pt", 3 * MiB)
    os.link(v.checkpoints / "model.pt", v.checkpoints / "model-again.pt")  # the same blocks: counted once
    write(tmp_path / "outside.bin", 40 * MiB)
    (v.checkpoints / "outside").symlink_to(tmp_path / "outside.bin")  # someone else's bytes: not counted
    (v.logs / "sparse.log").open("wb").truncate(1 << 30)  # a 1 GiB hole: nothing allocated, nothing charged
    write(n.logs / "rank-0.log", 1 * MiB)
    stray = p.cp.data_dir / "jobs" / "999-aaaaaaaaaaaa"  # no job of the store owns it
    stray.mkdir()
    write(stray / "x", MiB)
    meter.sweep()
    rep = meter.report(spec(p), jobs=10)
    assert 3 * MiB <= team(rep, "vision")["bytes"] < 3 * MiB + 256 * 1024, rep
    assert MiB <= team(rep, "nlp")["bytes"] < MiB + 256 * 1024
    assert team(rep, None)["jobs"] == 1 and team(rep, None)["bytes"] >= MiB  # shown, charged to nobody
    assert team(rep, "vision")["quota_bytes"] == 2 * MiB and team(rep, "nlp")["quota_bytes"] == 512 * MiB
    assert rep["complete"] and rep["jobs"][0]["team"] == "vision" and rep["measured_at"] is not None
    assert meter.job(v.root.name)["bytes"] == team(rep, "vision")["bytes"]


def test_a_walk_cut_at_its_deadline_keeps_an_estimate_and_goes_on_at_the_next_sweep(plane):
    p, meter = plane, plane.cp.storage
    v = job_with_dir(p, "nlp")
    for i in range(2000):
        (v.logs / f"f{i}").write_bytes(b"x")
    write(v.checkpoints / "z-big", 4 * MiB)
    meter.sweep()
    full = meter.job(v.root.name)
    assert full["complete"] and full["bytes"] >= 4 * MiB
    meter.walk_budget_s = -1  # every walk is past its deadline at its first check
    meter.sweep()
    cut = meter.job(v.root.name)
    assert not cut["complete"] and cut["bytes"] == full["bytes"]  # kept, not the part counted
    meter.walk_budget_s = 30
    meter.sweep()  # the cut walk goes on from where it stopped, and ends
    assert meter.job(v.root.name)["complete"] and meter.job(v.root.name)["bytes"] == full["bytes"]
    fresh = StorageMeter(p.cp.loop_store, p.cp.configs, p.cp.lock, p.cp.data_dir, walk_budget_s=-1)
    fresh.sweep()  # no earlier measure: what was counted before the cut, marked as an estimate
    first = fresh.job(v.root.name)
    assert not first["complete"] and first["bytes"] < full["bytes"]


def test_over_quota_holds_the_team_warns_once_and_lets_go_when_usage_drops(plane):
    p, meter = plane, plane.cp.storage
    v, other = job_with_dir(p, "vision"), job_with_dir(p, "nlp")
    running = job_with_dir(p, "vision")
    with p.cp.store.session.begin() as s:  # as if it ran: the meter reads only its state
        s.get(JobRow, int(running.root.name.split("-")[0])).state = JobState.RUNNING
    write(v.checkpoints / "big", 5 * MiB)
    write(other.checkpoints / "big", 5 * MiB)
    meter.sweep()
    assert meter.holds().teams == {"vision"} and not meter.holds().reserve
    assert meter.holds().reason("vision") == "StorageQuota" and meter.holds().reason("nlp") is None
    for _ in range(3):
        meter.sweep()
        meter.check()
    [team_event] = events(p, "team.storage_quota")
    assert team_event.data["team"] == "vision" and team_event.data["quota_bytes"] == 2 * MiB
    [job_event] = events(p, "job.storage_quota")  # the running one, once; not the held ones
    assert str(job_event.job_id) == running.root.name.split("-")[0]
    # A restarted plane reads the crossing back: held from its first pass, no second warning.
    again = StorageMeter(p.cp.loop_store, p.cp.configs, p.cp.lock, p.cp.data_dir)
    again.restore()  # what `start` does before its thread runs
    assert again.holds().teams == {"vision"}
    again.check()  # before its first sweep nothing is measured: vision stays held
    assert again.holds().teams == {"vision"}
    again.sweep()
    assert len(events(p, "team.storage_quota")) == 1 and len(events(p, "job.storage_quota")) == 1
    (v.checkpoints / "big").unlink()  # the user deletes checkpoints
    meter.sweep()
    assert meter.holds().teams == frozenset()
    [cleared] = events(p, "team.storage_quota_cleared")
    assert cleared.data["team"] == "vision"


def test_a_quota_changed_in_the_configuration_holds_at_the_next_check(plane):
    p, meter = plane, plane.cp.storage
    write(job_with_dir(p, "nlp").checkpoints / "big", 3 * MiB)
    meter.sweep()
    assert meter.holds().teams == frozenset()
    text = with_vision_quota(identity_config_text(), 2 / 1024) + STORAGE.replace("0.5", "0.001")
    assert p.admin.post("/api/v1/cluster/config", json={"text": text}).status_code in (200, 201)
    meter.check()  # no new walk needed
    assert meter.holds().teams == {"nlp"}


def test_the_reserve_holds_every_team_and_says_so_once(plane):
    p, meter = plane, plane.cp.storage
    text = identity_config_text() + "storage: {reserve_gb: 1000000000, interval: 1h}\n"  # more than any disk
    assert p.admin.post("/api/v1/cluster/config", json={"text": text}).status_code in (200, 201)
    meter.sweep()
    meter.check()
    assert meter.holds().reserve and meter.holds().reason("nlp") == "DiskReserve"
    [low] = events(p, "plane.disk_reserve")
    assert str(p.cp.data_dir) in low.message and low.data["file_systems"][0]["low"]
    rep = meter.report(spec(p))
    assert rep["reserve_crossed"] and rep["file_systems"][0]["path"] == str(p.cp.data_dir)
    assert p.admin.post("/api/v1/cluster/config", json={"text": identity_config_text()}).status_code in (200, 201)
    meter.check()
    assert not meter.holds().reserve and len(events(p, "plane.disk_reserve_cleared")) == 1


def test_the_api_and_the_metrics_show_it_to_readers(plane):
    p, meter = plane, plane.cp.storage
    write(job_with_dir(p, "vision").checkpoints / "big", 3 * MiB)
    meter.sweep()
    viewer = p.as_user("carol", "viewer")
    rep = viewer.get("/api/v1/storage", params={"jobs": 5}).json()
    assert team(rep, "vision")["over"] and len(rep["jobs"]) == 1 and rep["jobs"][0]["bytes"] >= 3 * MiB
    assert p.http.get("/api/v1/storage").status_code == 401
    assert p.http.get("/api/v1/storage", params={"jobs": 5000}, headers=viewer.headers).status_code == 422
    metrics = dict(line.rsplit(" ", 1) for line in p.admin.get("/metrics").text.splitlines()
                   if line.startswith("trainyard_") and "storage" in line)
    assert float(metrics['trainyard_team_storage_bytes{team="vision"}']) >= 3 * MiB
    assert float(metrics['trainyard_team_storage_quota_bytes{team="vision"}']) == 2 * MiB
    assert float(metrics['trainyard_team_storage_over_quota{team="vision"}']) == 1.0
    assert float(metrics['trainyard_team_storage_over_quota{team="nlp"}']) == 0.0
    assert float(metrics[f'trainyard_storage_reserve_bytes{{path="{p.cp.data_dir}"}}']) > 0
