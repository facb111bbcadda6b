"""`yard share` and `yard prio` (control/reports/priority.py) through the API, on a plane whose loop does not
run: the order is the engine's (class, tier, urgency, score), the factors are those its functions
compute, fair share follows decayed usage, and a job the scheduler does not consider says why."""

from __future__ import annotations

import math

import pytest

from tests.plane import Plane, script
from tests.services.acct_history import NOW, H, Try, add_job
from trainyard.sched.ordering import OrderingParams


@pytest.fixture
def plane(tmp_path):
    p = Plane(tmp_path / "yard", start=False)
    p.cp.clock = lambda: NOW
    yield p
    p.cp.stop()


def submit(p: Plane, **body) -> int:
    return p.submit(command=script("pass"), **body)["id"]


def test_share_follows_decayed_usage(plane):
    # vision ran 4 GPUs for the last 2 hours, nlp nothing
    add_job(plane, tries=(Try(2 * H, 4 * H, gpus=4),))
    rep = plane.as_user("vic", "viewer").get("/api/v1/share").json()
    v, n = (next(t for t in rep["teams"] if t["team"] == x) for x in ("vision", "nlp"))
    assert v["norm_shares"] == n["norm_shares"] == 0.5 and v["nominal_gpus"] == 4 and v["cohort"] == "lab"
    assert v["norm_usage"] == pytest.approx(1.0) and n["norm_usage"] == 0
    decay = math.log(2) / (7 * 86400)
    expect = 4 * (1 - math.exp(-decay * 2 * H)) / decay / 3600  # decayed GPU-hours
    assert v["raw_usage_gpu_hours"] == pytest.approx(expect)
    w = rep["fairshare_weight"]
    assert v["fairshare_factor"] == pytest.approx(min(8.0, (1.0 / 0.5) ** w))
    assert n["fairshare_factor"] == pytest.approx(max(0.125, (1e-6 / 0.5) ** w))
    assert v["level_fs"] == pytest.approx(0.5) and n["level_fs"] is None


def test_prio_shows_the_engines_order_and_its_factors(plane):
    # vision holds its whole nominal quota (4 GPUs on node-0): its next job would borrow
    add_job(plane, state="RUNNING", tries=(Try(3 * H, None, gpus=4),),
            placement=[{"node": "node-0", "gpus": [0, 1, 2, 3], "mem_mib": 0}])
    batch = submit(plane, team="nlp", gpus=1, **{"class": "batch"})
    borrow = submit(plane, team="vision", gpus=1, time="1h")
    short = submit(plane, team="nlp", gpus=1, time="10m")
    long = submit(plane, team="nlp", gpus=1, time="5h")
    inter = submit(plane, team="vision", gpus=1, **{"class": "interactive"})
    held = submit(plane, team="nlp", gpus=1, hold=True)
    rep = plane.as_user("vic", "viewer").get("/api/v1/priority").json()
    order = [j["id"] for j in rep["jobs"]]
    # in quota first, by class (interactive 300 — vision holds nothing at that priority — then training,
    # shortest first, then batch); then the training job vision would borrow for
    assert order == [inter, short, long, batch, borrow]
    assert [j["rank"] for j in rep["jobs"]] == [1, 2, 3, 4, 5]
    by = {j["id"]: j for j in rep["jobs"]}
    assert by[borrow]["tier"] == "borrowing" and by[short]["tier"] == "in-quota"
    assert by[inter]["class_priority"] == 300 and by[batch]["class"] == "batch"
    assert by[short]["remaining_gpu_s"] == 600 and by[long]["remaining_gpu_s"] == 5 * 3600
    assert by[short]["score"] == pytest.approx(math.log(600 * 1 * by[short]["fairshare_factor"]))  # waited 0 s
    assert not by[short]["urgent"] and by[short]["waited_fraction"] == 0
    assert rep["ordering"]["reserve_at"] == OrderingParams().reserve_at and rep["policy"] == "trainyard"
    one = plane.admin.get("/api/v1/priority", params={"jobs": str(long)}).json()["jobs"]
    assert [(j["id"], j["rank"]) for j in one] == [(long, 3)]  # its place among all, not among those asked
    r = plane.admin.get("/api/v1/priority", params={"jobs": str(held)})
    assert r.status_code == 409 and "held" in r.json()["detail"]
    assert plane.admin.get("/api/v1/priority", params={"jobs": "999"}).status_code == 404
    assert plane.admin.get("/api/v1/priority", params={"jobs": "x"}).status_code == 400


def test_sshare_fairshare_is_slurms_classic_factor():
    """yard share's FAIRSHARE (issue 35): 2^(-U/S), 0-1, higher = more priority."""
    from trainyard.control.reports.priority import sshare_fairshare

    assert sshare_fairshare(0.0, 0.5) == 1.0  # used nothing
    assert sshare_fairshare(0.5, 0.5) == 0.5  # used exactly its share
    assert sshare_fairshare(1.0, 0.25) == pytest.approx(2 ** -4)  # four times its share
    assert sshare_fairshare(0.3, 0.0) == 0.0 and sshare_fairshare(0.0, 0.0) == 1.0
