"""The stragglers step (control/loop/stragglers.py, control/loop/suspects.py) on the fake backend and
a fake clock (tests/fake_plane.py), with phase files written by the test as the runtime writes them
(contracts.py, above `PHASES_DIR`): a slow rank is flagged once with its node and both medians, and
again only after it recovered; a restarted plane does not flag it twice; two unrelated jobs make its
node suspect, an array's tasks do not; a suspect node takes no new work while a speed check
(real torch, on the CPU) runs, and is cleared (OK) or taken down (CRITICAL); without a speed check
it stays in service; a person's resume ends a suspicion. The real-process scenario is
tests/scenarios/test_stragglers.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fake_plane import FakePlane, fake
from tests.plane import TWO_TEAMS
from trainyard.contracts import PHASES_EVERY_S, JobDir
from trainyard.control.loop.stragglers import Stragglers
from trainyard.control.loop.suspects import Suspects
from trainyard.store.models import JobRow, NodeRow

FOREVER = fake()
# one rank on a CPU, no all-reduce: the smallest real measurement (mostly torch's import)
SPEED = {"name": "speed", "kind": "speed", "when": "before_work", "timeout": 60,
         "speed": {"device": "cpu", "cpu_ranks": 1, "matmul_n": 64, "iters": 2, "baselines": {"cpu": {"tflops": 1e-9}}}}


def plane(tmp_path: Path, speed: bool = False, **stragglers: Any) -> FakePlane:
    doc = yaml.safe_load(TWO_TEAMS.read_text())
    doc["stragglers"] = {"window": 5, **stragglers}
    if speed:
        doc["health"] = {"interval": "1h", "before_work_max_age": "1h", "checks": [SPEED]}
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    return FakePlane(tmp_path / "yard", config=cfg)


@pytest.fixture
def fp(tmp_path):
    p = plane(tmp_path)
    yield p
    p.stop()


def gang(fp: FakePlane, **more: Any) -> dict:
    """A running 2-rank job, one rank per node (rank 0 on node-0, rank 1 on node-1)."""
    j = fp.submit(command=FOREVER, team="vision", nodes=2, gpus_per_node=1, **more)
    return fp.wait(j["id"], "RUNNING")


def report(fp: FakePlane, j: dict, own: dict[int, float], steps: range = range(1, 11), comm: float = 0.05) -> None:
    """Each rank's phase file with `steps`: rank r's own work own[r] (the others wait for the slowest
    in the all-reduce, so every rank's step time is the same)."""
    jd = JobDir(Path(j["job_dir"]))
    slowest = max(own.values())
    for rank, work in own.items():
        path = jd.phases_file(j["attempt"], rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        recent = [[s, slowest + comm, slowest - work + comm] for s in steps]
        path.write_text(json.dumps({"v": 1, "attempt": j["attempt"], "rank": rank, "began": 1.0, "recent": recent}))


def read(fp: FakePlane) -> None:
    """A pass after the runtime's period: the step reads the files again."""
    fp.clock.advance(PHASES_EVERY_S)
    fp.step()


def kinds(fp: FakePlane, *wanted: str, node: str | None = None) -> list[dict]:
    return [e for e in fp.events() if e["kind"] in wanted and (node is None or e["node"] == node)]


def test_a_slow_rank_is_flagged_once_naming_its_node_and_again_only_after_it_recovered(fp):
    j = gang(fp)
    report(fp, j, {0: 0.1, 1: 0.1}, range(1, 4))  # three steps: fewer than the window, nobody judged
    read(fp)
    report(fp, j, {0: 0.1, 1: 0.4})
    read(fp)
    read(fp)
    (e,) = kinds(fp, "job.straggler")
    assert e["job_id"] == j["id"] and e["node"] == "node-1" and e["data"]["rank"] == 1, e
    assert e["data"]["median_s"] == pytest.approx(0.4) and e["data"]["gang_s"] == pytest.approx(0.1), e
    assert "rank 1 on node-1" in e["message"] and "0.4s" in e["message"] and "0.1s" in e["message"], e["message"]
    report(fp, j, {0: 0.1, 1: 0.1}, range(11, 21))
    read(fp)
    (r,) = kinds(fp, "job.straggler_recovered")
    assert r["data"]["rank"] == 1 and r["node"] == "node-1"
    report(fp, j, {0: 0.1, 1: 0.5}, range(21, 31))
    read(fp)
    assert len(kinds(fp, "job.straggler")) == 2
    show = fp.admin.get(f"/api/v1/jobs/{j['id']}/events").json()["events"]  # what `yard show` lists
    assert [e["kind"] for e in show if e["kind"].startswith("job.straggler")] == \
        ["job.straggler", "job.straggler_recovered", "job.straggler"]
    page = fp.admin.get(f"/ui/jobs/{j['id']}").text  # the dashboard's job page lists the job's events
    assert "job.straggler" in page and "rank 1 on node-1 straggles" in page


def test_a_restarted_plane_does_not_flag_the_same_rank_twice(fp):
    j = gang(fp)
    report(fp, j, {0: 0.4, 1: 0.1})
    read(fp)
    assert [e["data"]["rank"] for e in kinds(fp, "job.straggler")] == [0]
    loop = fp.cp.loop
    loop.stragglers = Stragglers(loop.ctx, Suspects(loop.ctx, loop.health))  # a new process: no memory
    read(fp)
    read(fp)
    assert len(kinds(fp, "job.straggler")) == 1


def test_disabled_reads_nothing_and_a_one_rank_job_is_never_judged(tmp_path):
    fp = plane(tmp_path, enabled=False)
    try:
        j = gang(fp)
        report(fp, j, {0: 0.1, 1: 0.9})
        read(fp)
        assert kinds(fp, "job.straggler") == []
    finally:
        fp.stop()


def test_two_unrelated_jobs_make_the_node_suspect_but_without_a_speed_check_it_stays_in_service(fp):
    a = gang(fp)
    report(fp, a, {0: 0.1, 1: 0.4})
    read(fp)
    assert kinds(fp, "node.suspect") == []  # one job says nothing about the node
    b = gang(fp)
    report(fp, b, {0: 0.1, 1: 0.4})
    read(fp)
    (e,) = kinds(fp, "node.suspect", node="node-1")
    assert e["data"]["jobs"] == [a["id"], b["id"]] and e["data"]["checked"] is False, e
    assert "no speed check is configured" in e["message"]
    n = fp.admin.get("/api/v1/nodes/node-1").json()
    assert n["suspect_since"] is not None and "straggler in jobs" in n["suspect_reason"], n
    c = gang(fp)  # unchecked: it still takes work
    assert "node-1" in {p["node"] for p in c["placement"]}
    fp.clock.advance(3600)
    fp.step()
    assert fp.admin.get("/api/v1/nodes/node-1").json()["suspect_since"] is None
    assert "lapsed" in kinds(fp, "node.suspect_cleared", node="node-1")[0]["message"]


def test_the_tasks_of_one_array_are_one_job_and_flags_before_the_window_do_not_count(fp):
    a = gang(fp)
    b = gang(fp)
    with fp.cp.store.session.begin() as s:  # b as a task of a's array (as `--array` submits mark them)
        s.get(JobRow, a["id"]).array_job_id = a["id"]
        s.get(JobRow, b["id"]).array_job_id = a["id"]
    for j in (a, b):
        report(fp, j, {0: 0.1, 1: 0.4})
    read(fp)
    assert len(kinds(fp, "job.straggler")) == 2 and kinds(fp, "node.suspect") == []
    fp.clock.advance(3601)  # a's and b's flags leave the window
    c = gang(fp)
    report(fp, c, {0: 0.1, 1: 0.4})
    read(fp)
    assert kinds(fp, "node.suspect") == []


def test_a_persons_resume_ends_the_suspicion(fp):
    for _ in range(2):
        report(fp, gang(fp), {0: 0.1, 1: 0.4})
    read(fp)
    assert fp.admin.get("/api/v1/nodes/node-1").json()["suspect_since"] is not None
    r = fp.admin.post("/api/v1/nodes/node-1/resume")
    assert r.status_code == 200, r.text
    assert r.json()["suspect_since"] is None and "resume" in kinds(fp, "node.suspect_cleared")[0]["message"]


def until_real(fp: FakePlane, pred: Any, timeout: float = 90.0) -> None:
    """Passes at the same fake time while real time goes by: the health checks run in real threads."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "not reached in real time"
        fp.step()
        time.sleep(0.2)


def node_row(fp: FakePlane, name: str) -> NodeRow:
    with fp.cp.store.session() as s:
        row = s.get(NodeRow, name)
        assert row is not None
        s.expunge(row)
        return row


def test_a_suspect_node_takes_no_work_until_its_speed_check_passes_then_is_cleared(tmp_path):
    pytest.importorskip("torch")
    fp = plane(tmp_path, speed=True)
    try:
        jobs = []
        for _ in range(2):
            j = fp.submit(command=FOREVER, team="vision", nodes=2, gpus_per_node=1)
            until_real(fp, lambda: fp.job(j["id"])["state"] == "RUNNING")  # the before-work checks pass first
            jobs.append(fp.job(j["id"]))
            report(fp, jobs[-1], {0: 0.1, 1: 0.4})
        fp.health_rounds = []
        fp.cp.loop.health.on_round = lambda node, ctx: fp.health_rounds.append((node, time.time()))
        read(fp)
        (e,) = kinds(fp, "node.suspect", node="node-1")
        assert e["data"]["checked"] is True and "speed check passes" in e["message"], e
        single = fp.submit(command=FOREVER, team="vision", gpus=1)
        for _ in range(3):
            fp.step()
        j = fp.job(single["id"])
        assert j["state"] == "PENDING" or {p["node"] for p in j["placement"]} == {"node-0"}, j
        until_real(fp, lambda: kinds(fp, "node.suspect_cleared", node="node-1"))
        (c,) = kinds(fp, "node.suspect_cleared", node="node-1")
        assert "the cause was the jobs" in c["message"] and "TFLOP/s" in c["message"], c["message"]
        # the checker publishes a round's results, then calls on_round: the loop may act on them first
        until_real(fp, lambda: fp.health_rounds, timeout=30)
        assert c["data"]["status"] == "ok" and ("node-1", ) == fp.health_rounds[0][:1]
        assert node_row(fp, "node-1").suspect_since is None and node_row(fp, "node-1").state == "up"
    finally:
        fp.stop()


def test_a_suspect_node_below_its_baseline_is_taken_down_and_the_suspicion_confirmed(tmp_path):
    pytest.importorskip("torch")
    fp = plane(tmp_path, speed=True)
    try:
        jobs = []
        for _ in range(2):
            j = fp.submit(command=FOREVER, team="vision", nodes=2, gpus_per_node=1)
            until_real(fp, lambda: fp.job(j["id"])["state"] == "RUNNING")
            jobs.append(fp.job(j["id"]))
        doc = yaml.safe_load((tmp_path / "cfg.yaml").read_text())
        doc["health"]["checks"][0]["speed"]["baselines"]["cpu"]["tflops"] = 1e5  # no CPU reaches it
        r = fp.admin.post("/api/v1/cluster/config", json={"text": yaml.safe_dump(doc)})
        assert r.status_code == 200, r.text
        for j in jobs:
            report(fp, j, {0: 0.1, 1: 0.4})
        read(fp)
        until_real(fp, lambda: kinds(fp, "node.suspect_confirmed", node="node-1"))
        (down,) = kinds(fp, "node.down", node="node-1")
        assert "speed" in down["message"] and "TFLOP/s" in down["message"], down["message"]
        assert node_row(fp, "node-1").state == "down" and node_row(fp, "node-1").suspect_since is None
        (c,) = kinds(fp, "node.suspect_confirmed", node="node-1")
        assert c["data"]["status"] == "critical" and "baseline" in c["message"]
        assert kinds(fp, "node.suspect_cleared") == []
    finally:
        fp.stop()
