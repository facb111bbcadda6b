"""Issue 39's first acceptance line on a real `yard up` with the `llama-pretrain` recipe on the local
backend's two emulated nodes (cgroup containment): a 2-rank job, one rank per node, with node-1
slowed by `yard chaos slow-node` is flagged (rank and node named) within 20 steps; a second job on
that node makes it suspect; its speed check runs before any new work lands there and takes it down;
after `yard chaos revive-node` the check passes and the node returns.

It is marked solo: `make test` runs it after the rest, alone, because a CPU quota emulates a slow
node only where the unslowed rank gets its CPU (CI's stop 46 ran it beside two other workers: the
unslowed rank's own work took 0.12 s a step, the slowed one's 0.25 s, and the flag came 27 steps
after the slow-down). Choices for a loaded 2-core machine (docs/control-plane.md, "Stragglers and suspect nodes"):
- the factor is 16, not 4: a CPU quota is a cap, and where other work leaves an unslowed rank only a
  quarter of a CPU a quarter-CPU cap changes nothing (backends/contain/cpu_quota.py);
- the straggler factor is 2, not 1.5: under such load an unslowed rank's median own work varied up
  to 1.8 times its peer's (measured), which 1.5 would flag;
- before_work_max_age is 90 s until node-1 is down (the second job must land there on the first
  job's round), then 5 s (applied as an operator would), so node-1 returns soon after the revive;
- the speed check's baseline is this machine's own figure, measured by the check's child before the
  plane starts, and a node must reach 40% of it: what the machine gives an unslowed rank varies with
  the load by up to twice, a slowed node's is capped at a sixteenth of a core.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.plane import TWO_TEAMS
from tests.recipes.helpers import TINY_PRETRAIN
from tests.yard_cluster import YardCluster

pytestmark = [pytest.mark.slow, pytest.mark.solo]

FACTOR = 16
SPEED = ["--device", "cpu", "--cpu-ranks", "1", "--matmul-n", "128", "--iters", "10"]
KINDS = ("node.suspect", "node.suspect_confirmed", "node.suspect_cleared", "node.down", "node.up", "node.check_ok",
         "node.check_critical", "node.check_warn")
SETS = [*TINY_PRETRAIN, "steps=100000", "checkpoint_every=1000"]


def machine_tflops() -> float:
    out = subprocess.run([sys.executable, "-m", "trainyard.control.health.speed", *SPEED], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["tflops"][0])


def config(tmp_path: Path, baseline: float) -> Path:
    doc = yaml.safe_load(TWO_TEAMS.read_text())
    # before_work_max_age: long enough that the second job lands on node-1 on the round the first
    # passed, short enough that a node taken down is checked again while work waits for it
    doc["health"] = {"interval": "1h", "before_work_max_age": "90s", "checks": [{
        "name": "speed", "kind": "speed", "when": "before_work", "timeout": "2m",
        "speed": {"device": "cpu", "cpu_ranks": 1, "matmul_n": 128, "iters": 10, "min_fraction": 1.0,
                  "baselines": {"cpu": {"tflops": baseline}}}}]}
    # factor 2: under this machine's load an unslowed rank's median own work varied from 0.7 to
    # 1.8 times its peer's (measured), which 1.5 would flag
    doc["stragglers"] = {"window": 10, "factor": 2}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def events(c: YardCluster, *kinds: str, node: str | None = None) -> list[dict]:
    evs = c.http.get("/api/v1/events", params={"limit": 5000}).json()["events"]
    return [e for e in evs if e["kind"] in kinds and (node is None or e["node"] == node)]


def newest_step(c: YardCluster, job: int, rank: int) -> int:
    path = c.job_dir(job) / "metrics" / "phases" / f"attempt-{c.job(job)['attempt']}-rank-{rank}.json"
    try:
        return int(json.loads(path.read_text()).get("step") or 0)
    except (OSError, ValueError):
        return 0


def step_at(c: YardCluster, job: int, t: float) -> int:
    """The gang's step at time `t`: the newest step rank 0's metrics.jsonl says ended by then (the
    ranks of a synchronous gang step together; the phase files are rewritten only every 1 s)."""
    done = 0
    for line in (c.job_dir(job) / "metrics" / "metrics.jsonl").read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "event" not in r and isinstance(r.get("step"), int) and isinstance(r.get("time"), (int, float)) \
                and r["time"] <= t:
            done = max(done, r["step"])
    return done


def until(pred, timeout: float, what: str):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while not (got := pred()):
        assert time.monotonic() < deadline, f"{what}: not after {timeout:.0f}s"
        time.sleep(0.2)
    return got


def test_a_slowed_node_is_flagged_suspected_checked_drained_and_returns_after_revive(tmp_path):
    baseline = 0.4 * machine_tflops()
    c = YardCluster(tmp_path, "local", config_file=config(tmp_path, baseline))
    try:
        if c.yard("chaos", "slow-node", "node-0", "--factor", "2", check=False).returncode != 0:
            pytest.skip("no cgroup CPU quota here: slow-node cannot slow a node")
        c.yard("chaos", "revive-node", "node-0")
        gang = ("--recipe", "llama-pretrain", "-N", "2", "--gpus-per-node", "1", "-A", "vision",
                *(x for s in SETS for x in ("--set", s)))
        a = c.submit(*gang)
        c.wait(a, "RUNNING", timeout=180)
        until(lambda: newest_step(c, a, 1) >= 30, 180, "job a's first steps")
        assert events(c, "job.straggler") == []  # unslowed, nobody straggles
        c.yard("chaos", "slow-node", "node-1", "--factor", str(FACTOR))
        t_slow = time.time()  # the quota is in place: every step ending after this was slowed
        (flag,) = until(lambda: events(c, "job.straggler"), 180, "job a's straggler flag")
        assert flag["job_id"] == a and flag["node"] == "node-1" and flag["data"]["rank"] == 1, flag
        assert "rank 1 on node-1" in flag["message"], flag["message"]
        at_slow = step_at(c, a, t_slow)
        within = flag["data"]["steps"][1] - at_slow
        print(f"flagged {within} steps and {flag['time'] - t_slow:.1f}s after slow-node (window ends at step "
              f"{flag['data']['steps'][1]}); {flag['message']}")
        assert within <= 20, (at_slow, flag)
        show = c.yard("show", str(a)).stdout
        assert "straggler" in show and "rank 1 on node-1" in show, show

        b = c.submit(*gang)
        c.wait(b, "RUNNING", timeout=120)
        assert {p["node"] for p in c.job(b)["placement"]} == {"node-0", "node-1"}
        (suspect,) = until(lambda: events(c, "node.suspect", node="node-1"), 180, "node-1 suspect")
        assert suspect["data"]["jobs"] == [a, b] and suspect["data"]["checked"] is True, suspect
        nodes = c.yard("nodes").stdout
        assert "+suspect" in nodes or events(c, "node.suspect_confirmed"), nodes
        (confirmed,) = until(lambda: events(c, "node.suspect_confirmed", node="node-1"), 240, "the speed check's verdict")
        trail = [(round(e["time"] - suspect["time"], 1), e["kind"], e["message"][:160])
                 for e in events(c, *KINDS, node="node-1")]
        print("node-1:", *trail, sep="\n  ")
        down = next(e for e in events(c, "node.down", node="node-1") if e["time"] >= suspect["time"])
        assert "speed" in down["message"] and "TFLOP/s" in down["message"], down["message"]
        print(f"suspect at {suspect['time']:.1f}, down at {down['time']:.1f}: {down['message']}")
        # nothing new landed on node-1 between the suspicion and its going down
        for j in c.http.get("/api/v1/jobs", params={"limit": 100}).json()["jobs"]:
            for att in c.job(j["id"])["attempts"]:
                if suspect["time"] <= att["started_at"] <= down["time"]:
                    assert "node-1" not in {p["node"] for p in att["placement"]}, (j["id"], att)

        # The long before_work_max_age served its end (job b landed on node-1 on job a's round); a
        # node its checks took down is checked again once its newest round is that old, while work
        # waits for it: 90 s would be waited out after revive-node (97.6 s measured). An operator's
        # shorter age, applied now, brings node-1 back on the first round after the revive.
        shorter = yaml.safe_load(c.yard("cluster", "get").stdout)
        shorter["health"]["before_work_max_age"] = "5s"
        (tmp_path / "shorter.yaml").write_text(yaml.safe_dump(shorter, sort_keys=False))
        c.yard("cluster", "apply", str(tmp_path / "shorter.yaml"), "-m", "before_work_max_age 5s")
        c.yard("chaos", "revive-node", "node-1")
        t_revive = time.time()
        until(lambda: c.http.get("/api/v1/nodes/node-1").json()["state"] == "up", 360, "node-1 back after revive")
        ups = [e for e in events(c, "node.up", node="node-1") if e["time"] > down["time"]]
        assert ups and "passed its checks" in ups[-1]["message"], ups
        passed = [e for e in events(c, "node.check_ok", node="node-1") if e["time"] > down["time"]]
        assert passed, "no passing speed check after revive"
        print(f"node-1 back {ups[-1]['time'] - t_revive:.1f}s after revive-node")
    finally:
        c.stop()
