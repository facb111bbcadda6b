"""GET /api/v1/jobs/{id}/goodput and /api/v1/report/goodput (api/routers/goodput.py): the job's
answer keeps its shape (`yard bench scaling` reads it), a running attempt is split live from the
phase files its ranks write, who may read what, and bad input is a 400 naming the parameter."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterator

import pytest

from tests.plane import Plane
from tests.services.acct_history import T0, H, Try, add_job
from trainyard.contracts import LEDGER_BUCKETS, JobDir
from trainyard.services import auth
from trainyard.services.auth import Principal

NOW = T0 + 4 * H


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    p = Plane(tmp_path / "yard", start=False)
    p.cp.clock = lambda: NOW
    yield p
    p.cp.stop()


def running_with_phases(p: Plane) -> int:
    """A vision job running since 3 h on 2 GPUs (2 ranks), whose ranks wrote their phase files."""
    jid = add_job(p, name="live", state="RUNNING", tries=(Try(3 * H, None, gpus=2),), dir_key="k9", tasks_per_node=2)
    jd = JobDir.of(p.cp.data_dir, jid, "k9")
    jd.phases_dir.mkdir(parents=True)
    for rank in (0, 1):
        jd.phases_file(1, rank).write_text(json.dumps({
            "v": 1, "attempt": 1, "rank": rank, "began": T0 + 3 * H + 120, "last": NOW - 1, "step": 900, "steps": 900,
            "phases": {"step": 3000.0, "data_wait": 300.0, "checkpoint_stall": 60.0, "comm": 30.0 * rank},
            "after_last": {"checkpoint_stall": 0.0}, "ended": None, "recent": [[900, 3.0, 0.0]]}))
    return jid


def test_a_running_jobs_answer_is_split_live_from_its_phase_files(plane):
    jid = running_with_phases(plane)
    r = plane.admin.get(f"/api/v1/jobs/{jid}/goodput")
    assert r.status_code == 200, r.text
    g = r.json()
    assert set(g) == {"job_id", "allocated_gpu_s", "buckets", "attempts"}
    (a,) = g["attempts"]
    assert set(a) == {"attempt", "started_at", "ended_at", "gpus", "allocated_gpu_s", "buckets", "live"}
    assert a["live"] and a["ended_at"] is None and a["gpus"] == 2
    assert set(a["buckets"]) == set(LEDGER_BUCKETS)
    assert math.fsum(a["buckets"].values()) == pytest.approx(2 * H) == g["allocated_gpu_s"]
    b = a["buckets"]
    assert b["startup"] == pytest.approx(2 * 120) and b["data_wait"] == pytest.approx(2 * 300)
    assert b["checkpoint_stall"] == pytest.approx(2 * 60) and b["comm_wait"] == pytest.approx(30)
    assert b["idle"] == 0 and b["teardown"] == 0


def test_who_may_read_a_jobs_goodput(plane):
    jid = add_job(plane, name="done", tries=(Try(0, H),))
    other = add_job(plane, name="other", team="nlp", user="bob", tries=(Try(0, H),))
    with plane.cp.store.session.begin() as s:
        job_token = auth.create_token(s, user="alice", role="job", team="vision", by=Principal("admin", "admin"),
                                      job_id=jid)
    as_job = plane.client(job_token)
    assert as_job.get(f"/api/v1/jobs/{jid}/goodput").status_code == 200
    assert as_job.get(f"/api/v1/jobs/{other}/goodput").status_code == 403
    assert as_job.get("/api/v1/report/goodput").status_code == 403
    assert plane.as_user("vic", "viewer").get(f"/api/v1/jobs/{other}/goodput").status_code == 200
    assert plane.admin.get("/api/v1/jobs/99999/goodput").status_code == 404


def test_the_report_over_the_api(plane):
    running_with_phases(plane)
    add_job(plane, name="done", team="nlp", user="bob", tries=(Try(0, H, gpus=1),))
    r = plane.admin.get("/api/v1/report/goodput", params={"start": f"@{T0}", "end": f"@{NOW}", "by": "team,node"})
    assert r.status_code == 200, r.text
    rep = r.json()
    assert set(rep["sections"]) == {"team", "node"}
    teams = {x["key"]: x for x in rep["sections"]["team"]}
    assert teams["vision"]["allocated_gpu_s"] == pytest.approx(2 * H)
    assert teams["vision"]["buckets"]["data_wait"] == pytest.approx(600)  # the live split, as the job's answer
    assert teams["nlp"]["allocated_gpu_s"] == pytest.approx(H)
    viewer = plane.as_user("vic", "viewer").get("/api/v1/report/goodput", params={"start": f"@{T0}"}).json()
    assert viewer["users_shown"] == "none" and viewer["sections"]["user"] == []


@pytest.mark.parametrize("params,field", [
    ({"by": "team,rack"}, "by"),
    ({"start": "yesterday-ish"}, "start"),
    ({"start": "now", "end": "now-2hours"}, "end"),
])
def test_bad_input_is_a_400_naming_the_parameter(plane, params, field):
    r = plane.admin.get("/api/v1/report/goodput", params=params)
    assert r.status_code == 400 and r.json()["field"] == field, r.text


def test_a_preempted_and_resumed_jobs_recompute_is_its_lost_work(tmp_path):
    """Real rank processes: a job that checkpoints (`trainyard.demo.work`) is requeued (the notice,
    a checkpoint, exit 75), resumes and completes; each attempt's ledger was stored when it ended,
    adds up to its GPU-seconds, and the first one's recompute is the work it lost."""
    import sys
    import time

    from tests.plane import job_dir
    from trainyard.store.models import AttemptRow

    p = Plane(tmp_path / "live")
    try:
        work = [sys.executable, "-m", "trainyard.demo.work", "--steps", "30", "--step-time", "0.1", "--ckpt-every", "5"]
        j = p.submit(command=work, gpus=2, team="vision")
        p.wait(j["id"], "RUNNING")
        ck = job_dir(p.cp.data_dir, j["id"]) / "checkpoints"
        deadline = time.monotonic() + 120
        while not (ck / "step-5" / "COMMITTED").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert p.admin.post(f"/api/v1/jobs/{j['id']}/requeue").status_code == 200
        done = p.wait(j["id"], "COMPLETED", timeout=120)
        assert len(done["attempts"]) == 2 and done["attempts"][0]["cause"] == "requeued"  # as a preemption: the notice
        g = p.admin.get(f"/api/v1/jobs/{j['id']}/goodput").json()
        with p.cp.store.session() as s:
            stored = {a.attempt: a.ledger for a in s.query(AttemptRow).filter_by(job_id=j["id"])}
        for a, t in zip(g["attempts"], done["attempts"]):
            assert stored[a["attempt"]] == pytest.approx(a["buckets"])  # stored when it ended, read back
            assert math.fsum(a["buckets"].values()) == pytest.approx(2 * (t["ended_at"] - t["started_at"]), abs=1e-6)
            assert a["buckets"]["recompute"] == pytest.approx(t["lost_gpu_s"], abs=1e-6)
        assert g["attempts"][0]["buckets"]["teardown"] > 0  # from the notice to its end
        assert done["attempts"][0]["lost_gpu_s"] > 0  # the steps after step 5's checkpoint, before the notice's
    finally:
        p.stop()
