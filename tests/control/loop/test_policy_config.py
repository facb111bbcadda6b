"""A live plane runs the policy its configuration names, and a new version's policy on its next pass.

Real loop, real local backend, real rank processes. The submissions are the same each time: with
all 4 GPUs taken, a 4-GPU job and then a 1-GPU job queue up; when the GPUs come free, FIFO starts
the 4-GPU job (first in line, and then the 1-GPU job is blocked behind nothing but capacity),
while trainyard starts the 1-GPU job (shortest GPU-time first) and keeps the 4-GPU one waiting.
"""

from __future__ import annotations

import time

from tests.plane import IDENTITY_YAML, Plane, script

ONE_NODE = """cluster:
  name: t
  nodes:
    - {name: node, gpus: 4, gpu_model: emulated, gpu_mem_gb: 16}
teams:
  - name: vision
    quotas:
      default: {nominal: 4}
classes:
  - {name: training, priority: 200, preemptible: true, max_wait: 24h, grace_period: 0}
default_class: training
""" + IDENTITY_YAML  # its jobs run as the test's account (tests/plane.py)
FIFO = ONE_NODE + "scheduler:\n  policy: fifo\n"
SLEEP = script("import time; time.sleep(600)")


def first_to_start(p: Plane) -> str:
    """Run the scenario once; 'big' or 'small': which of the two queued jobs the policy started."""
    blocker = p.submit(command=SLEEP, team="vision", gpus=4)
    p.wait(blocker["id"], "RUNNING")
    big = p.submit(command=SLEEP, team="vision", gpus=4, name="big")
    time.sleep(0.05)  # a later submit time for FIFO to see
    small = p.submit(command=SLEEP, team="vision", gpus=1, name="small")
    for j in (big, small):  # both seen waiting by a pass: the next start is the policy's choice
        p.wait(j["id"], lambda j: j["state"] == "PENDING" and j["reason"] not in (None, "", "None"))
    assert p.admin.post(f"/api/v1/jobs/{blocker['id']}/cancel").status_code == 200
    deadline = time.monotonic() + 30
    while True:
        states = {name: p.job(j["id"])["state"] for name, j in (("big", big), ("small", small))}
        running = [name for name, state in states.items() if state == "RUNNING"]
        if running:
            break
        assert time.monotonic() < deadline, states
        time.sleep(0.05)
    time.sleep(0.5)  # a few more passes: the other one must still be waiting
    states = {name: p.job(j["id"])["state"] for name, j in (("big", big), ("small", small))}
    assert sorted(states.values()) == ["PENDING", "RUNNING"], states
    for j in (big, small):
        p.admin.post(f"/api/v1/jobs/{j['id']}/cancel")
    for j in (blocker, big, small):
        p.wait(j["id"], "CANCELLED")
    return running[0]


def test_the_configured_policy_runs_and_an_applied_version_changes_it_without_a_restart(tmp_path):
    config = tmp_path / "fifo.yaml"
    config.write_text(FIFO)
    p = Plane(tmp_path / "d", config=config)
    try:
        assert first_to_start(p) == "big"  # fifo, from the configuration given at start
        r = p.admin.post("/api/v1/cluster/config", json={"text": ONE_NODE, "message": "back to the default"})
        assert r.status_code == 200, r.text
        assert first_to_start(p) == "small"  # trainyard, on the loop's next passes: no restart
        tuned = ONE_NODE + "scheduler:\n  policy: trainyard\n  params:\n    ordering: {reserve_at: 0}\n"
        # reserve_at 0: every job is urgent at once, and urgent jobs go oldest first (FIFO order)
        assert p.admin.post("/api/v1/cluster/config", json={"text": tuned}).status_code == 200
        assert first_to_start(p) == "big"
        # The flat names of before the groups are still read, and `yard cluster apply` warns of each.
        flat = ONE_NODE + "scheduler:\n  params:\n    reclaim_after_s: 2m\n"
        r = p.admin.post("/api/v1/cluster/config", json={"text": flat})
        assert r.status_code == 200, r.text
        assert ("scheduler.params.reclaim_after_s is deprecated; write it in its group: "
                "preemption: {reclaim_after_s: ...}") in r.json()["warnings"]
    finally:
        p.stop()
