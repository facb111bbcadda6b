"""Node and rank failures on the emulated cluster: noticed, drained, jobs resumed elsewhere from
their checkpoint, the node returned after its check (the local backend's fault injection)."""

from __future__ import annotations

import re
import sys
import time

from tests.plane import node_info, wait_until

WORK = [sys.executable, "-m", "trainyard.demo.work", "--steps", "30", "--step-time", "0.1", "--ckpt-every", "5"]


def _checkpointed(plane, j: dict) -> dict:
    """The job once running, after its first checkpoint (step 5) is committed."""
    first = plane.wait(j["id"], "RUNNING")
    ck = plane.cp.data_dir / "jobs" / str(j["id"]) / "checkpoints"
    wait_until(lambda: (ck / "step-5" / "COMMITTED").exists())
    return first


def test_a_dead_node_is_drained_and_its_job_resumes_on_another_node(plane):
    j = plane.submit(command=WORK, gpus=2, team="vision")
    first = _checkpointed(plane, j)
    node = first["placement"][0]["node"]
    other = "node-1" if node == "node-0" else "node-0"
    plane.cp.backend.kill_node(node)
    wait_until(lambda: node_info(plane, node)["state"] == "down")
    again = plane.wait(j["id"], lambda x: x["state"] == "RUNNING" and x["attempt"] == 2, timeout=20)
    assert {p["node"] for p in again["placement"]} == {other}
    done = plane.wait(j["id"], "COMPLETED", timeout=30)
    a1 = done["attempts"][0]
    assert (a1["state"], a1["cause"]) == ("NODE_FAIL", "node_lost") and done["retries"] == 1
    assert a1["lost_gpu_s"] < 2 * 10  # at most a checkpoint interval's work on 2 GPUs (and the notice)
    log = (plane.cp.data_dir / "jobs" / str(j["id"]) / "logs" / "rank-0.log").read_text()
    assert "attempt 2 starts at step 5" in log or "attempt 2 starts at step 1" in log  # resumed, not restarted
    kinds = [e["kind"] for e in plane.admin.get("/api/v1/events", params={"limit": 1000}).json()["events"]]
    assert "node.down" in kinds and "job.retry" in kinds, kinds
    # Back after its check passes, and only then.
    assert node_info(plane, node)["state"] == "down"
    plane.cp.backend.revive_node(node)
    wait_until(lambda: node_info(plane, node)["state"] == "up")


def test_a_frozen_node_is_drained_its_job_resumes_elsewhere_and_it_returns_once_its_check_passes(plane):
    """A frozen GPU or node (every rank on it stopped, the node's check says `hung`)."""
    j = plane.submit(command=WORK, gpus=2, team="vision")
    first = _checkpointed(plane, j)
    node = first["placement"][0]["node"]
    other = "node-1" if node == "node-0" else "node-0"
    plane.cp.backend.hang_node(node)
    wait_until(lambda: node_info(plane, node)["state"] == "down", timeout=20)
    again = plane.wait(j["id"], lambda x: x["state"] == "RUNNING" and x["attempt"] == 2, timeout=30)
    assert {p["node"] for p in again["placement"]} == {other}
    done = plane.wait(j["id"], "COMPLETED", timeout=40)
    log = (plane.cp.data_dir / "jobs" / str(j["id"]) / "logs" / "rank-0.log").read_text()
    resumed = re.search(r"attempt 2 starts at step (\d+)", log)
    assert resumed and int(resumed.group(1)) >= 5, log  # from its checkpoint, not from the start
    assert done["attempts"][0]["state"] != "COMPLETED"
    assert node_info(plane, node)["state"] == "down"  # not back while its check fails
    plane.cp.backend.revive_node(node)
    wait_until(lambda: node_info(plane, node)["state"] == "up", timeout=20)
    kinds = [e["kind"] for e in plane.admin.get("/api/v1/events", params={"limit": 1000}).json()["events"]]
    assert "node.down" in kinds and "node.up" in kinds, kinds


def test_a_hung_rank_is_killed_and_the_job_resumes_away_from_its_node(plane):
    j = plane.submit(command=WORK, gpus=2, team="vision")
    first = _checkpointed(plane, j)
    suspect = first["placement"][0]["node"]
    plane.cp.backend.hang_rank(j["id"], 1, 1)
    done = plane.wait(j["id"], "COMPLETED", timeout=40)
    a1 = done["attempts"][0]
    assert a1["cause"] == "hung" and done["retries"] == 1 and done["attempt"] == 2
    # the frozen rank's node is a suspect: with the other node free, the next attempt went there
    assert done["avoid_nodes"] == [suspect]
    assert {p["node"] for p in done["attempts"][1]["placement"]} == {"node-1" if suspect == "node-0" else "node-0"}
    events = plane.admin.get("/api/v1/events", params={"job": j["id"], "limit": 100}).json()["events"]
    assert any(e["kind"] == "job.avoid_node" and suspect in e["message"] for e in events)
    # training time lost, not wall time: the ranks were frozen for most of the attempt's end
    assert a1["lost_gpu_s"] < 2 * (5 + 1) * 0.1 + 1.0, a1


def test_an_operator_drain_is_not_undone_by_the_health_check(plane):
    plane.admin.post("/api/v1/nodes/node-1/drain", json={"reason": "maintenance"})
    time.sleep(0.5)
    assert node_info(plane, "node-1")["state"] == "drain"


def test_a_drained_node_that_fails_moves_its_jobs_and_stays_drained_after_it_recovers(plane):
    """As Slurm's DRAIN: a failure on a drained node moves its jobs, and its recovery does not
    put it back in service; only a person's resume does."""
    plane.admin.post("/api/v1/nodes/node-1/drain", json={"reason": "new cables"})
    j = plane.submit(command=WORK, gpus=2, team="vision")
    assert {p["node"] for p in plane.wait(j["id"], "RUNNING")["placement"]} == {"node-0"}
    plane.admin.post("/api/v1/nodes/node-1/resume")
    plane.admin.post("/api/v1/nodes/node-0/drain", json={"reason": "firmware"})
    _checkpointed(plane, j)
    plane.cp.backend.kill_node("node-0")
    again = plane.wait(j["id"], lambda x: x["state"] == "RUNNING" and x["attempt"] == 2, timeout=30)
    assert {p["node"] for p in again["placement"]} == {"node-1"}
    info = node_info(plane, "node-0")
    assert info["state"] == "drain" and "firmware" in info["reason"] and "(health)" in info["reason"], info
    plane.cp.backend.revive_node("node-0")
    plane.wait(j["id"], "COMPLETED", timeout=40)
    assert node_info(plane, "node-0")["state"] == "drain"  # recovered, still drained
    plane.admin.post("/api/v1/nodes/node-0/resume")
    wait_until(lambda: node_info(plane, "node-0")["state"] == "up")


def test_an_elastic_job_goes_on_with_the_nodes_left_when_one_dies(plane):
    j = plane.submit(command=WORK, nodes="1-2", gpus_per_node=2, team="vision")
    first = _checkpointed(plane, j)
    assert len(first["placement"]) == 2  # room for its maximum: it starts on both nodes
    dead = first["placement"][1]["node"]
    t0 = time.monotonic()
    plane.cp.backend.kill_node(dead)
    again = plane.wait(j["id"], lambda x: x["state"] == "RUNNING" and x["attempt"] == 2, timeout=20)
    assert time.monotonic() - t0 < 5  # no backoff and no waiting for the dead node
    assert [p["node"] for p in again["placement"]] != [dead] and len(again["placement"]) == 1
    done = plane.wait(j["id"], "COMPLETED", timeout=30)
    assert done["attempts"][0]["cause"] == "node_lost"
    plane.cp.backend.revive_node(dead)


def test_an_elastic_job_grows_back_when_the_node_returns(plane):
    work = WORK[:WORK.index("--steps") + 1] + ["120"] + WORK[WORK.index("--steps") + 2:]
    j = plane.submit(command=work, nodes="1-2", gpus_per_node=2, team="vision")
    first = _checkpointed(plane, j)
    dead = first["placement"][1]["node"]
    plane.cp.backend.kill_node(dead)
    plane.wait(j["id"], lambda x: x["state"] == "RUNNING" and x["attempt"] == 2 and len(x["placement"]) == 1)
    plane.cp.backend.revive_node(dead)
    grown = plane.wait(j["id"], lambda x: x["state"] == "RUNNING" and x["attempt"] == 3, timeout=20)
    assert len(grown["placement"]) == 2
    done = plane.wait(j["id"], "COMPLETED", timeout=40)
    assert [a["cause"] for a in done["attempts"]] == ["node_lost", "requeued", "completed"]
    log = (plane.cp.data_dir / "jobs" / str(j["id"]) / "logs" / "rank-0.log").read_text()
    assert "attempt 3 starts at step 0" not in log  # it grew from a checkpoint, it did not start over
