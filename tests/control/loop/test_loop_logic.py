"""The control loop's own logic on the fake backend and a fake clock (tests/fake_plane.py).

What is tested here is what the loop decides from the facts — the stop sequence and its timing,
requeue on exit 75, retries and their budget, failed and frozen ranks, dead and frozen nodes, the
operator's drain, elastic jobs, preemption and reclaim, reasons — with the production loop
parameters, to the fake second. How real processes produce those facts is tested with real
processes: tests/backends (the conformance suite on the local backend and real Slurm),
tests/control/test_e2e.py, tests/scenarios (chaos on `yard up`).
"""

from __future__ import annotations

import re
import signal

import pytest

from tests.fake_plane import WORK, FakePlane, fake
from tests.plane import job_dir
from trainyard.control.loop.context import LoopParams
from trainyard.control.loop.orchestrator import rest_after


@pytest.fixture
def fp(tmp_path):
    p = FakePlane(tmp_path / "yard")
    yield p
    p.stop()


def _checkpointed(fp: FakePlane, j: dict, step: int = 5) -> dict:
    """The job once running, after its checkpoint of `step` is committed."""
    first = fp.wait(j["id"], "RUNNING")
    ck = job_dir(fp.cp.data_dir, j["id"]) / "checkpoints" / f"step-{step}" / "COMMITTED"
    fp.until(ck.exists, within=60)
    return first


def _node(fp: FakePlane, name: str) -> dict:
    return fp.admin.get(f"/api/v1/nodes/{name}").json()


def _other(node: str) -> str:
    return "node-1" if node == "node-0" else "node-0"


def _resumed_from(fp: FakePlane, job_id: int, attempt: int) -> int:
    log = (job_dir(fp.cp.data_dir, job_id) / "logs" / "rank-0.log").read_text()
    found = re.search(rf"attempt {attempt} .*?resumed from step (\d+)", log, re.S)
    assert found, log
    return int(found.group(1))


# -- the stop sequence ------------------------------------------------------------------------------


def test_a_job_that_ignores_the_notice_gets_sigterm_after_grace_then_sigkill(fp):
    """Requeue: SIGUSR1 at once, SIGTERM when the class's grace period (batch: 2 s) is over,
    SIGKILL `kill_wait_s` (10 s) after that; each at its fake second."""
    j = fp.submit(command=fake("term=ignore", "usr1=ignore"), team="vision", **{"class": "batch"})
    fp.wait(j["id"], "RUNNING")
    t0 = fp.clock()
    assert fp.admin.post(f"/api/v1/jobs/{j['id']}/requeue").status_code == 200
    done = fp.wait(j["id"], lambda x: x["attempts"][0]["state"] == "REQUEUED")
    sent = [(s.sig, round(s.at - t0)) for s in fp.backend.signals if s.job_id == j["id"]]
    assert sent == [(signal.SIGUSR1, 0), (signal.SIGTERM, 2), (signal.SIGKILL, 12)], sent
    first = done["attempts"][0]
    assert first["signal"] == 9 and "without a checkpoint exit" in first["reason"]


def test_a_notice_that_is_answered_with_exit_75_needs_no_sigterm(fp):
    j = fp.submit(command=WORK, gpus=2, team="vision", **{"class": "batch"})
    _checkpointed(fp, j)
    fp.admin.post(f"/api/v1/jobs/{j['id']}/requeue")
    again = fp.wait(j["id"], lambda x: x["attempt"] == 2 and x["state"] == "RUNNING")
    first = again["attempts"][0]
    assert (first["state"], first["exit_code"], first["cause"]) == ("REQUEUED", 75, "requeued")
    assert [s.sig for s in fp.backend.signals if s.job_id == j["id"]] == [signal.SIGUSR1]
    assert first["lost_gpu_s"] == 0  # it checkpointed the step it stopped at
    assert _resumed_from(fp, j["id"], 2) >= 5


def test_time_limit_ends_the_job_as_timeout(fp):
    j = fp.submit(command=fake("term=ignore"), time="2m", team="vision")
    start = fp.wait(j["id"], "RUNNING")["start_time"]
    t = fp.wait(j["id"], "TIMEOUT")
    assert t["reason"] == "TimeLimit" and 120 <= t["end_time"] - start <= 120 + 10 + 2  # limit, kill wait, ticks
    assert [s.sig for s in fp.backend.signals if s.job_id == j["id"]] == [signal.SIGTERM, signal.SIGKILL]


# -- exits, retries --------------------------------------------------------------------------------


def test_exit_75_requeues_and_the_next_attempt_resumes(fp):
    j = fp.submit(command=fake("run=10", "step=1", "ckpt=5", "exit=75", "rank0:exit=75"), team="vision")
    first = fp.wait(j["id"], lambda x: x["attempt"] == 2)
    assert first["attempts"][0]["state"] == "REQUEUED" and first["retries"] == 0


def test_a_crash_after_progress_is_retried_from_its_checkpoint_with_backoff(fp):
    j = fp.submit(command=fake("run=12", "step=1", "ckpt=5", "exit=1"), team="vision")
    ended = fp.wait(j["id"], lambda x: x["attempts"][0]["ended_at"] is not None)
    retry = fp.wait(j["id"], lambda x: x["attempt"] == 2)
    assert retry["attempts"][0]["cause"] == "crash" and retry["retries"] == 1
    # the first retry waits retry_backoff_s (10 s) after the crash
    assert 10 <= retry["attempts"][1]["started_at"] - ended["attempts"][0]["ended_at"] <= 12
    assert retry["attempts"][0]["lost_gpu_s"] <= 3  # steps 10-12, after the checkpoint of step 10
    assert _resumed_from(fp, j["id"], 2) == 10
    kinds = [e["kind"] for e in fp.events(j["id"])]
    assert "job.retry" in kinds


def test_retries_stop_at_the_class_budget_with_doubling_backoff(fp):
    j = fp.submit(command=fake("run=3", "step=1", "ckpt=1", "exit=1"), team="vision")
    failed = fp.wait(j["id"], "FAILED", timeout=900)
    assert failed["retries"] == 3 and len(failed["attempts"]) == 4  # the training class allows 3 retries
    a = failed["attempts"]
    gaps = [round(nxt["started_at"] - cur["ended_at"]) for cur, nxt in zip(a, a[1:])]
    assert gaps == [10, 20, 40], gaps


def test_a_plain_job_that_fails_is_told_by_its_exit_code_and_not_retried(fp):
    j = fp.submit(command=fake("run=1", "exit=3"), team="vision")
    f = fp.wait(j["id"], "FAILED")
    assert f["reason"] == "NonZeroExitCode 3 on rank 0" and f["retries"] == 0 and f["exit_code"] == 3


def test_out_of_memory_is_reported_and_not_retried(fp):
    j = fp.submit(command=fake("run=4", "step=1", "ckpt=2", "oom"), team="vision")
    o = fp.wait(j["id"], "OUT_OF_MEMORY")
    assert o["attempts"][0]["cause"] == "oom" and o["retries"] == 0


def test_a_rank_the_kernel_oom_killed_over_its_mem_is_oom_not_a_crash(fp):
    # The backend's fact (oom_killed), no log marker; --mem reaches the launch as its limit.
    j = fp.submit(command=fake("run=4", "step=1", "ckpt=2", "rank1:oom=kill"), gpus=2, team="vision", mem="1G")
    o = fp.wait(j["id"], "OUT_OF_MEMORY")
    assert o["attempts"][0]["cause"] == "oom" and o["retries"] == 0 and "rank 1" in o["reason"]
    assert o["mem_mib"] == 1024
    assert fp.backend.cluster.launched[(j["id"], 1)].spec.limits.mem_mib == 1024


def test_one_failed_rank_stops_the_others_and_the_job_fails(fp):
    j = fp.submit(command=fake("step=1", "ckpt=2", "rank1:run=4", "rank1:exit=4"), gpus=2, team="vision",
                  **{"class": "batch"})
    fp.wait(j["id"], lambda x: x["attempts"] and x["attempts"][-1]["ended_at"] is not None)
    first = fp.job(j["id"])["attempts"][0]
    assert "rank 1" in first["reason"] and first["exit_code"] == 4
    kinds = [e["kind"] for e in fp.events(j["id"])]
    assert "job.rank_failed" in kinds
    assert [s.sig for s in fp.backend.signals if s.job_id == j["id"]][0] == signal.SIGTERM


# -- nodes ------------------------------------------------------------------------------------------


def test_a_dead_node_is_drained_and_its_job_resumes_on_another_node(fp):
    j = fp.submit(command=WORK, gpus=2, team="vision")
    node = _checkpointed(fp, j)["placement"][0]["node"]
    fp.run(2)
    fp.backend.kill_node(node)
    again = fp.wait(j["id"], lambda x: x["state"] == "RUNNING" and x["attempt"] == 2, timeout=5)
    assert {p["node"] for p in again["placement"]} == {_other(node)}
    assert _node(fp, node)["state"] == "down"
    done = fp.wait(j["id"], "COMPLETED")
    a1 = done["attempts"][0]
    assert (a1["state"], a1["cause"]) == ("NODE_FAIL", "node_lost") and done["retries"] == 1
    assert 0 < a1["lost_gpu_s"] <= 2 * 3  # the steps since its checkpoint, on 2 GPUs
    assert _resumed_from(fp, j["id"], 2) == 5
    kinds = [e["kind"] for e in fp.events()]
    assert "node.down" in kinds and "job.retry" in kinds
    fp.run(30)
    assert _node(fp, node)["state"] == "down"  # back only when its check passes
    fp.backend.revive_node(node)
    fp.until(lambda: _node(fp, node)["state"] == "up", within=5)


def test_a_frozen_node_is_drained_its_job_resumes_elsewhere_and_it_returns_once_its_check_passes(fp):
    j = fp.submit(command=WORK, gpus=2, team="vision")
    node = _checkpointed(fp, j)["placement"][0]["node"]
    fp.backend.hang_node(node)
    fp.until(lambda: _node(fp, node)["state"] == "down", within=5)
    # frozen ranks cannot act on SIGTERM: they end with the SIGKILL after the kill wait
    again = fp.wait(j["id"], lambda x: x["state"] == "RUNNING" and x["attempt"] == 2, timeout=20)
    assert {p["node"] for p in again["placement"]} == {_other(node)}
    assert again["attempts"][0]["signal"] == 9
    assert _resumed_from(fp, j["id"], 2) >= 5
    fp.wait(j["id"], "COMPLETED")
    assert _node(fp, node)["state"] == "down"
    fp.backend.revive_node(node)
    fp.until(lambda: _node(fp, node)["state"] == "up", within=5)
    kinds = [e["kind"] for e in fp.events()]
    assert "node.down" in kinds and "node.up" in kinds


def test_a_hung_rank_is_killed_after_the_hung_time_and_the_job_resumes_away_from_its_node(fp):
    j = fp.submit(command=WORK, gpus=2, team="vision")
    suspect = _checkpointed(fp, j)["placement"][0]["node"]
    fp.backend.hang_rank(j["id"], 1, 0)
    frozen_at = fp.clock()
    done = fp.wait(j["id"], "COMPLETED")
    a1 = done["attempts"][0]
    assert a1["cause"] == "hung" and done["retries"] == 1 and done["attempt"] == 2
    assert 30 <= a1["ended_at"] - frozen_at <= 32  # hung_after_s, then SIGKILL at once
    assert [s.sig for s in fp.backend.signals if s.job_id == j["id"]] == [signal.SIGKILL]
    assert done["avoid_nodes"] == [suspect]
    assert {p["node"] for p in done["attempts"][1]["placement"]} == {_other(suspect)}
    assert any(e["kind"] == "job.avoid_node" and suspect in e["message"] for e in fp.events(j["id"]))
    assert a1["lost_gpu_s"] <= 2 * 1  # training time lost, not the 30 s it sat frozen


def test_an_operator_drain_is_not_undone_by_the_health_check(fp):
    fp.admin.post("/api/v1/nodes/node-1/drain", json={"reason": "maintenance"})
    fp.run(30)
    assert _node(fp, "node-1")["state"] == "drain"


def test_a_drained_node_takes_no_new_work(fp):
    assert fp.admin.post("/api/v1/nodes/node-0/drain", json={"reason": "bad fan"}).status_code == 200
    jobs = [fp.submit(command=fake("run=2"), gpus=2, team="vision") for _ in range(3)]
    for j in jobs:
        assert {p["node"] for p in fp.wait(j["id"], "COMPLETED")["placement"]} == {"node-1"}
    big = fp.submit(command=fake("run=2"), gpus=8, team="vision")
    fp.run(10)
    assert fp.job(big["id"])["state"] == "PENDING"
    fp.admin.post("/api/v1/nodes/node-0/resume")
    fp.wait(big["id"], "COMPLETED", timeout=10)


def test_a_drained_node_that_fails_moves_its_jobs_and_stays_drained_after_it_recovers(fp):
    """As Slurm's DRAIN: a failure on a drained node moves its jobs, and its recovery does not
    put it back in service; only a person's resume does."""
    fp.admin.post("/api/v1/nodes/node-1/drain", json={"reason": "new cables"})
    j = fp.submit(command=WORK, gpus=2, team="vision")
    assert {p["node"] for p in fp.wait(j["id"], "RUNNING")["placement"]} == {"node-0"}
    fp.admin.post("/api/v1/nodes/node-1/resume")
    fp.admin.post("/api/v1/nodes/node-0/drain", json={"reason": "firmware"})
    _checkpointed(fp, j)
    fp.backend.kill_node("node-0")
    again = fp.wait(j["id"], lambda x: x["state"] == "RUNNING" and x["attempt"] == 2, timeout=10)
    assert {p["node"] for p in again["placement"]} == {"node-1"}
    info = _node(fp, "node-0")
    assert info["state"] == "drain" and "firmware" in info["reason"] and "(health)" in info["reason"], info
    fp.backend.revive_node("node-0")
    fp.wait(j["id"], "COMPLETED")
    assert _node(fp, "node-0")["state"] == "drain"  # recovered, still drained
    fp.admin.post("/api/v1/nodes/node-0/resume")
    fp.until(lambda: _node(fp, "node-0")["state"] == "up", within=5)


def test_an_elastic_job_goes_on_with_the_nodes_left_when_one_dies(fp):
    j = fp.submit(command=WORK, nodes="1-2", gpus_per_node=2, team="vision")
    first = _checkpointed(fp, j)
    assert len(first["placement"]) == 2  # room for its maximum: it starts on both nodes
    dead = first["placement"][1]["node"]
    fp.backend.kill_node(dead)
    took = fp.until(lambda: fp.job(j["id"])["attempt"] == 2 and fp.job(j["id"])["state"] == "RUNNING", within=30)
    assert took <= 2  # no backoff and no waiting for the dead node
    again = fp.job(j["id"])
    assert [p["node"] for p in again["placement"]] == [_other(dead)]
    done = fp.wait(j["id"], "COMPLETED")
    assert done["attempts"][0]["cause"] == "node_lost"


def test_an_elastic_job_grows_back_when_the_node_returns(fp):
    j = fp.submit(command=fake("run=60", "step=1", "ckpt=5", "usr1=1"), nodes="1-2", gpus_per_node=2, team="vision")
    dead = _checkpointed(fp, j)["placement"][1]["node"]
    fp.backend.kill_node(dead)
    fp.wait(j["id"], lambda x: x["state"] == "RUNNING" and x["attempt"] == 2 and len(x["placement"]) == 1)
    fp.run(6)
    fp.backend.revive_node(dead)
    grown = fp.wait(j["id"], lambda x: x["state"] == "RUNNING" and x["attempt"] == 3, timeout=10)
    assert len(grown["placement"]) == 2
    done = fp.wait(j["id"], "COMPLETED")
    assert [a["cause"] for a in done["attempts"]] == ["node_lost", "requeued", "completed"]
    assert _resumed_from(fp, j["id"], 3) > 5  # it grew from a checkpoint of attempt 2, it did not start over
    assert any(e["kind"] == "job.grow" for e in fp.events(j["id"]))


# -- scheduling -------------------------------------------------------------------------------------


def test_held_job_waits_until_released(fp):
    j = fp.submit(command=fake("run=1"), hold=True, team="vision")
    fp.run(10)
    assert (fp.job(j["id"])["state"], fp.job(j["id"])["reason"]) == ("PENDING", "JobHeldUser")
    assert fp.admin.post(f"/api/v1/jobs/{j['id']}/release").status_code == 200
    fp.wait(j["id"], "COMPLETED", timeout=5)


def test_reclaim_preempts_the_borrower_by_checkpoint(fp):
    """vision borrows nlp's idle quota; when nlp submits, vision's borrowed GPUs come back by
    checkpoint, after the reclaim patience (EngineParams.reclaim_after_s, capped by the victim
    class's grace and min run time)."""
    vision = [fp.submit(command=WORK, gpus=4, team="vision", **{"class": "batch"}) for _ in range(2)]
    for j in vision:
        _checkpointed(fp, j)
    nlp = fp.submit(command=fake("run=5"), gpus=4, team="nlp", **{"class": "batch"})
    fp.wait(nlp["id"], "COMPLETED", timeout=120)
    preempted = [e for e in fp.events() if e["kind"] == "job.preempting"]
    assert len(preempted) == 1 and preempted[0]["data"]["reason"] == "reclaim"
    victim = fp.job(preempted[0]["job_id"])
    first = victim["attempts"][0]
    assert (first["state"], first["exit_code"], first["lost_gpu_s"]) == ("PREEMPTED", 75, 0)
    fp.wait(victim["id"], lambda x: x["state"] == "RUNNING" and x["attempt"] == 2, timeout=60)
    assert _resumed_from(fp, victim["id"], 2) >= 5


def test_a_gang_blocked_by_fragmentation_moves_single_gpu_jobs_to_the_other_node(fp):
    """Two single-GPU jobs left on each node (the short ones beside them ended): 4 GPUs free, no
    node whole. nlp's 4-GPU job moves one node's two jobs to the other node by checkpoint
    (EngineParams.move_after_s, step 5e); they resume there, nothing is lost."""
    long = fake("run=600", "step=1", "ckpt=5", "usr1=1", "term=1")
    jobs = [fp.submit(command=long if k in (2, 3, 6, 7) else fake("run=8"), gpus=1, team="vision") for k in range(8)]
    for j in jobs:
        fp.wait(j["id"], "RUNNING")
    stay = [jobs[k] for k in (2, 3, 6, 7)]
    where = {j["id"]: fp.job(j["id"])["placement"][0]["node"] for j in stay}
    assert sorted(where.values()) == ["node-0", "node-0", "node-1", "node-1"], where
    for k in (0, 1, 4, 5):
        fp.wait(jobs[k]["id"], "COMPLETED")
    for j in stay:
        _checkpointed(fp, j)
    gang = fp.submit(command=fake("run=5"), gpus=4, gpus_per_node=4, nodes="1", team="nlp")
    fp.wait(gang["id"], "COMPLETED", timeout=300)
    moved = [e for e in fp.events() if e["kind"] == "job.preempting"]
    assert {e["data"]["reason"] for e in moved} == {"move"} and len(moved) == 2
    node = fp.job(gang["id"])["placement"][0]["node"]
    for e in moved:
        j = fp.wait(e["job_id"], lambda x: x["state"] == "RUNNING" and x["attempt"] == 2, timeout=60)
        assert where[e["job_id"]] == node and j["placement"][0]["node"] == _other(node)
        first = j["attempts"][0]
        assert (first["state"], first["exit_code"], first["lost_gpu_s"]) == ("PREEMPTED", 75, 0)
        assert _resumed_from(fp, e["job_id"], 2) >= 5


def test_non_preemptible_jobs_are_never_preempted(fp):
    inter = [fp.submit(command=fake("run=600"), gpus=4, team="vision", **{"class": "interactive"}) for _ in range(2)]
    for j in inter:
        fp.wait(j["id"], "RUNNING")
    nlp = fp.submit(command=fake("run=1"), gpus=4, team="nlp")
    fp.run(300)
    assert fp.job(nlp["id"])["state"] == "PENDING"
    assert all(fp.job(j["id"])["state"] == "RUNNING" and fp.job(j["id"])["attempt"] == 1 for j in inter)
    assert not fp.backend.signals


def test_higher_priority_class_preempts_lower_within_a_team(fp):
    batch = fp.submit(command=WORK, gpus=4, team="vision", **{"class": "batch"})
    other = fp.submit(command=fake("run=600"), gpus=4, team="nlp", **{"class": "interactive"})
    fp.wait(batch["id"], "RUNNING")
    fp.wait(other["id"], "RUNNING")
    urgent = fp.submit(command=fake("run=1"), gpus=2, team="vision", **{"class": "interactive"})
    fp.wait(urgent["id"], "COMPLETED", timeout=30)
    assert fp.job(batch["id"])["attempts"][0]["state"] == "PREEMPTED"
    assert fp.job(other["id"])["attempt"] == 1  # the other team's job was not touched


def test_the_notice_goes_out_in_the_pass_that_decides_the_preemption(fp):
    """Not a tick later: on Slurm a pass takes a while and passes are a tick apart, so waiting
    for the next one's stop step made the notice late by a second or two (issue 20)."""
    batch = fp.submit(command=WORK, gpus=4, team="vision", **{"class": "batch"})
    fp.submit(command=fake("run=600"), gpus=4, team="nlp", **{"class": "interactive"})
    fp.wait(batch["id"], "RUNNING")
    urgent = fp.submit(command=fake("run=1"), gpus=2, team="vision", **{"class": "interactive"})
    fp.until(lambda: any(e["kind"] == "job.preempting" for e in fp.events(batch["id"])), within=30)
    decided = next(e for e in fp.events(batch["id"]) if e["kind"] == "job.preempting")
    sent = [x for x in fp.backend.signals if x.job_id == batch["id"]]
    assert sent and sent[0].at == pytest.approx(decided["time"]), (sent, decided)
    fp.wait(urgent["id"], "COMPLETED", timeout=30)


def test_pending_jobs_get_a_reason_and_estimated_start(fp):
    first = fp.submit(command=fake("run=20"), gpus=8, team="vision", time="30s")
    fp.wait(first["id"], "RUNNING")
    waiting = fp.submit(command=fake("run=1"), gpus=8, team="vision")
    j = fp.wait(waiting["id"], lambda j: j["reason"] not in ("None", ""), timeout=5)
    # vision (nominal 4, borrowing limit 4) holds 8: 8 more would borrow 12, beyond its limit
    # (issue 35: the limit that holds a job is named), and the GPUs free when the first job ends
    assert j["reason"] == "QuotaBorrowingLimit"
    assert j["est_start"] is not None and j["est_start"] >= first["submit_time"]


# -- pacing -----------------------------------------------------------------------------------------


def test_an_unwoken_loop_runs_a_tick_after_the_last_pass_ended_and_a_slow_pass_rests_twice_as_long():
    p = LoopParams()
    assert rest_after(0.3, p.tick_s, p) == 0  # the tick's wait was the pause (not a tick + 2 x 0.3 s)
    assert rest_after(0.3, 0.1, p) == pytest.approx(0.5)  # woken at once: twice the pass, the tick's wait counted
    assert rest_after(0.01, 0.0, p) == p.min_interval_s  # wakes closer than this are merged
    assert rest_after(10.0, 0.0, p) == p.max_pause_s  # capped
    assert rest_after(10.0, p.tick_s, p) == p.max_pause_s - p.tick_s
