"""Issue 6 on a real Slurm (2 nodes × 4 GPUs, tests/slurm_cluster.py) driven by `yard up --backend
slurm`: a 2-node `llama-pretrain` job trains with 8 ranks across both nodes; a preemption by an
urgent job goes notice → checkpoint → requeue → resume with losses bit for bit those of an
uninterrupted run; a node whose slurmd dies (Slurm: DOWN) makes an elastic job resume on the node
left, with no person involved; cancel leaves nothing running in Slurm.
"""

from __future__ import annotations

import time

import pytest

from tests.recipes.helpers import TINY_PRETRAIN
from tests.yard_cluster import YardCluster, losses

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm-scenarios")]

STEPS = 24
SETS = [*TINY_PRETRAIN, f"steps={STEPS}", "checkpoint_every=4", "watchdog_s=60"]


@pytest.fixture(scope="module")
def yc(tmp_path_factory):
    c = YardCluster(tmp_path_factory.mktemp("yard-slurm"), "slurm")
    yield c
    c.stop()


def submit(yc: YardCluster, *shape: str) -> int:
    args = ["--recipe", "llama-pretrain", *shape, "-A", "vision"]
    for s in SETS:
        args += ["--set", s]
    return yc.submit(*args)


@pytest.fixture(scope="module")
def reference(yc) -> dict[int, float]:
    job = submit(yc, "-N", "2", "--gpus-per-node", "4")
    j = yc.wait(job, lambda j: j["state"] not in ("PENDING", "RUNNING", "COMPLETING"), timeout=300)
    assert j["state"] == "COMPLETED", (j["state"], j["reason"], (yc.data_dir / "up.log").read_text()[-2000:])
    # 8 ranks over both Slurm nodes, each with one of its node's GPUs
    logs = yc.job_dir(job) / "logs"
    heads = [(logs / f"rank-{r}.log").read_text().splitlines()[0] for r in range(8)]
    assert sum(" on n1 " in h for h in heads) == 4 and sum(" on n2 " in h for h in heads) == 4, heads
    assert all("slurm job" in h for h in heads)
    ref = losses(yc.job_dir(job))
    assert sorted(ref) == list(range(1, STEPS + 1))
    return ref


def test_a_two_node_job_trains_with_eight_ranks_across_both_nodes(yc, reference):
    assert reference[STEPS] < reference[1]
    yc.wait_slurm_empty()


def test_preemption_by_an_urgent_job_resumes_bit_for_bit(yc, reference):
    job = submit(yc, "-N", "2", "--gpus-per-node", "4")
    yc.wait_committed(job, 4)
    # The victim trains its last 20 steps in ~5 s, while the notice needs a `yard chaos` process and
    # a few loop passes (each runs Slurm's client commands): under load the job used to finish first,
    # attempt 1 COMPLETED and nothing preempted. So its ranks are frozen (SIGSTOP through Slurm, as
    # the notice itself goes; Slurm shows the job STOPPED) until the plane has sent the notice; they
    # then take it at their next step boundary, as a busy job would. Well within the plane's 30 s
    # before frozen ranks count as hung.
    sid = _slurm_id(yc, job, 1)
    yc.slurm.run("scancel", "--signal=STOP", sid)
    try:
        out = yc.yard("chaos", "preempt", "--job", str(job), "--seconds", "2").stdout
        assert "submitted urgent interactive job" in out
        _wait_event(yc, job, "sent SIGUSR1 (preempt)", timeout=25)
    finally:
        yc.slurm.run("scancel", "--signal=CONT", sid)
    j = yc.wait(job, lambda j: j["state"] not in ("PENDING", "RUNNING", "COMPLETING", "REQUEUED"), timeout=300)
    assert j["state"] == "COMPLETED", (j["state"], j["reason"])
    assert j["attempts"][0]["state"] == "PREEMPTED" and len(j["attempts"]) >= 2
    assert losses(yc.job_dir(job)) == reference  # the last loss of every step, bit for bit, on 8 ranks
    # it did resume from the preemption checkpoint: under load the notice can land after the last step,
    # and the job then resumes from its final checkpoint (STEPS) with nothing left to do
    assert 4 <= _resumed_step(yc.job_dir(job)) <= STEPS
    events = [e["kind"] for e in yc.http.get("/api/v1/events", params={"job": job, "limit": 500}).json()["events"]]
    assert "job.preempting" in events or any(k.startswith("job.preempt") for k in events), events
    yc.wait_slurm_empty()


def _slurm_id(yc: YardCluster, job: int, attempt: int) -> str:
    """The Slurm job that runs `attempt` of trainyard's `job`: Slurm's job name is the job's own
    name, so the ids are read from its comment ("trainyard job J attempt A", squeue's %k)."""
    comment = f"trainyard job {job} attempt {attempt}"
    lines = yc.slurm.run("squeue", "-h", "-o", "%i|%k").stdout.splitlines()
    return next(line.split("|", 1)[0] for line in lines if line.split("|", 1)[-1].strip() == comment)


def _wait_event(yc: YardCluster, job: int, message: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        events = yc.http.get("/api/v1/events", params={"job": job, "limit": 500}).json()["events"]
        if any(message in e["message"] for e in events):
            return
        assert time.monotonic() < deadline, f"no event {message!r} for job {job} after {timeout}s: {events}"
        time.sleep(0.1)


def _resumed_step(job_dir) -> int:  # noqa: ANN001
    """The step attempt 2 resumed from (the runtime logs "resumed from step N")."""
    log = (job_dir / "logs" / "rank-0.log").read_text()
    return int(log.split("resumed from step ")[1].split()[0])


def test_a_node_lost_in_slurm_resumes_the_elastic_job_on_the_node_left(yc):
    job = submit(yc, "-N", "1-2", "--gpus-per-node", "4")
    first = yc.wait(job, "RUNNING", timeout=120)
    assert len(first["placement"]) == 2
    yc.wait_committed(job, 4)
    yc.slurm.kill_slurmd("n2", steps=True)  # the host is gone: its slurmd and its ranks
    try:
        t = time.monotonic()
        again = yc.wait(job, lambda j: j["state"] == "RUNNING" and j["attempt"] >= 2, timeout=90)
        assert [p["node"] for p in again["placement"]] == ["n1"], again["placement"]
        assert yc.http.get("/api/v1/nodes/n2").json()["state"] != "up"
        done = yc.wait(job, lambda j: j["state"] in ("COMPLETED", "FAILED"), timeout=300)
        assert done["state"] == "COMPLETED" and done["attempts"][0]["cause"] == "node_lost", done["attempts"]
        print(f"\nslurm node loss: resumed on n1 {time.monotonic() - t:.1f}s after slurmd died")
    finally:
        yc.slurm.start_slurmd("n2")
    yc.slurm.wait_nodes("IDLE", timeout=60)
    deadline = time.monotonic() + 30
    while yc.http.get("/api/v1/nodes/n2").json()["state"] != "up":
        assert time.monotonic() < deadline, "n2 did not come back in trainyard"
        time.sleep(0.2)


def test_cancel_leaves_nothing_running_in_slurm(yc):
    job = submit(yc, "-N", "2", "--gpus-per-node", "4")
    yc.wait(job, "RUNNING", timeout=120)
    yc.yard("cancel", str(job))
    yc.wait(job, "CANCELLED", timeout=60)
    yc.wait_slurm_empty()


def test_without_a_config_yard_up_takes_the_nodes_from_slurm(yc, tmp_path):
    from tests.plane import YardServer

    server = YardServer(tmp_path, args=("--backend", "slurm"), env={**yc.env(), **yc.slurm.env()})
    http = server.start(config=False)
    try:
        nodes = http.get("/api/v1/nodes").json()["nodes"]
        assert sorted((n["name"], n["gpus"], n["state"]) for n in nodes) == [("n1", 4, "up"), ("n2", 4, "up")]
    finally:
        server.terminate()


def test_bad_backend_options_are_refused_with_exit_2(yc, tmp_path):
    r = yc.yard("up", "--data-dir", str(tmp_path), "--backend", "kubernetes", check=False)
    assert r.returncode == 2 and "--backend" in r.stderr
    r = yc.yard("up", "--data-dir", str(tmp_path), "--backend", "slurm", "--nodes", "2", check=False)
    assert r.returncode == 2 and "--nodes" in r.stderr
