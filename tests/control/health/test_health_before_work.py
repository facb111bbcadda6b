"""Checks before a node takes new work (issue 7 item 1): a real `yard up` with two emulated nodes
and an NHC-style executable check, with the periodic interval an hour long, so that whatever
the check catches, the before-work round caught it.

The check writes one line per run (`node context`) to a log, so the tests can tell which round
ran it: `TRAINYARD_CHECK_CONTEXT` is `periodic` or `before_work`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import yaml

from tests.plane import TWO_TEAMS, Plane, YardServer, node_info, wait_until

WORK = [sys.executable, "-c", "import time; time.sleep(1)"]  # ranks that start fast on a busy machine
LONG = [sys.executable, "-c", "import time; time.sleep(600)"]
# CRITICAL while the file bad-<node> exists in the data dir; every run logged to checks.log.
CHECK = [sys.executable, "-c",
         "import os, sys, time; d, n = os.environ['TRAINYARD_DATA_DIR'], os.environ['TRAINYARD_NODE'];"
         "open(os.path.join(d, 'checks.log'), 'a').write(f\"{n} {os.environ['TRAINYARD_CHECK_CONTEXT']}\\n\");"
         "p = os.path.join(d, 'bad-' + n); s = float(open(os.path.join(d, 'slow-' + n)).read())"
         " if os.path.exists(os.path.join(d, 'slow-' + n)) else 0; time.sleep(s);"
         "e = os.path.exists(p); print('GPU 1: 2 uncorrectable ECC errors' if e else 'ok'); sys.exit(2 if e else 0)"]


def config(tmp_path: Path, **health) -> Path:
    doc = yaml.safe_load(TWO_TEAMS.read_text())
    doc["health"] = {"interval": "1h", "before_work_max_age": "2s", "checks": [{"name": "ecc", "command": CHECK}],
                     **health}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def runs(data: Path) -> list[tuple[str, str]]:
    log = data / "checks.log"
    return [tuple(line.split()) for line in log.read_text().splitlines()] if log.exists() else []


def submit(c: httpx.Client, data: Path, command: list[str], gpus: int) -> int:
    r = c.post("/api/v1/jobs", json={"command": command, "gpus": gpus, "team": "vision", "workdir": str(data)})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def job(c: httpx.Client, jid: int) -> dict:
    return c.get(f"/api/v1/jobs/{jid}").json()


def node(c: httpx.Client, name: str) -> dict:
    return c.get(f"/api/v1/nodes/{name}").json()


def events(c: httpx.Client, name: str) -> list[dict]:
    return [e for e in c.get("/api/v1/events", params={"limit": 2000}).json()["events"] if e.get("node") == name]


def test_a_failing_check_between_periodic_rounds_is_caught_before_work_lands(tmp_path):
    data = tmp_path / "yard"
    data.mkdir()
    srv = YardServer(data, config_file=config(tmp_path))
    c = srv.start()
    try:
        # the periodic round at start-up passes on both nodes; the next one is an hour away
        wait_until(lambda: {("node-0", "periodic"), ("node-1", "periodic")} <= set(runs(data)))
        (data / "bad-node-0").write_text("")
        time.sleep(2.5)  # both nodes' rounds are now older than before_work_max_age

        # 1. the job lands on the node that passes its before-work round, never on node-0
        a = submit(c, data, LONG, 2)
        wait_until(lambda: job(c, a)["state"] == "RUNNING")
        assert {p["node"] for p in job(c, a)["placement"]} == {"node-1"}
        wait_until(lambda: node(c, "node-0")["state"] == "down")
        assert "ECC" in node(c, "node-0")["reason"]
        crit = [e for e in events(c, "node-0") if e["kind"] == "node.check_critical"]
        assert crit and crit[0]["data"]["context"] == "before_work", crit
        assert ("node-0", "before_work") in runs(data)
        assert runs(data).count(("node-0", "periodic")) == 1  # no periodic round caught it

        # 2. while work waits for it, a node its checks took down is checked again (not in an hour)
        (data / "bad-node-0").unlink()
        b = submit(c, data, WORK, 4)  # only node-0 has room for it
        wait_until(lambda: job(c, b)["state"] in ("RUNNING", "COMPLETED"), timeout=20)
        assert {p["node"] for p in job(c, b)["placement"]} == {"node-0"}
        assert node(c, "node-0")["state"] == "up"
        wait_until(lambda: job(c, b)["state"] == "COMPLETED", timeout=30)

        # 3. a person resumes a drained node: it takes no work until a round after the resume passes
        assert c.post("/api/v1/nodes/node-0/drain", json={"reason": "cabling"}).status_code == 200
        (data / "bad-node-0").write_text("")
        assert c.post("/api/v1/nodes/node-0/resume").status_code == 200
        d = submit(c, data, WORK, 4)  # again only node-0 has room
        wait_until(lambda: node(c, "node-0")["state"] == "down")
        assert job(c, d)["state"] == "PENDING" and not job(c, d)["attempts"]
        (data / "bad-node-0").unlink()
        wait_until(lambda: job(c, d)["state"] in ("RUNNING", "COMPLETED"), timeout=20)
        assert {p["node"] for p in job(c, d)["placement"]} == {"node-0"}
        assert job(c, a)["attempt"] == 1 and job(c, a)["state"] == "RUNNING"  # node-1's job was never disturbed
        assert c.post(f"/api/v1/jobs/{a}/cancel").status_code == 200
        wait_until(lambda: job(c, a)["state"] == "CANCELLED" and job(c, d)["state"] == "COMPLETED", timeout=30)
    finally:
        srv.terminate()


def test_the_loop_never_waits_for_a_before_work_round(tmp_path):
    """node-0's check takes 5 s: the job starts on node-1 as soon as node-1's round passes, while
    node-0's round still runs, and the loop keeps stepping meanwhile (in process, to read its
    step times)."""
    p = Plane(tmp_path / "yard", config=config(tmp_path), start=False)
    data = p.cp.data_dir
    (data / "slow-node-0").write_text("5")
    p.cp.start()
    try:
        j = p.submit(command=WORK, gpus=2, team="vision")
        got = p.wait(j["id"], ("RUNNING", "COMPLETED"), timeout=10)
        assert p.cp.loop.health.pending("node-0"), "the job waited for the slow node's round"
        assert {q["node"] for q in got["placement"]} == {"node-1"}
        assert p.cp.loop.stats.last_step_ms < 500
        assert node_info(p, "node-0")["state"] == "up"
    finally:
        p.stop()


# -- the checker's rounds, without a control plane --------------------------------------------------

def test_rounds_periodic_and_before_work(tmp_path):
    from trainyard.control.health import BEFORE_WORK, PERIODIC, HealthChecker
    from trainyard.spec.models import HealthSpec

    spec = HealthSpec(interval=3600, checks=[{"name": "ecc", "command": CHECK},
                                             {"name": "diag", "command": CHECK, "when": "before_work"}])
    rounds: list[tuple[str, str]] = []
    hc = HealthChecker(tmp_path, lambda: spec, lambda: ["node-0"], on_round=lambda n, c: rounds.append((n, c)))
    t0 = time.time()
    assert [r.check for r in hc.run_now("node-0")] == ["ecc"]  # a periodic round leaves before-work checks out
    assert not hc.fresh("node-0", spec, t0)  # diag never ran
    (tmp_path / "slow-node-0").write_text("1")
    assert hc.request("node-0") and hc.pending("node-0")
    assert not hc.request("node-0")  # one round per node at a time: asking again is that round
    wait_until(lambda: not hc.pending("node-0"), timeout=10)
    assert hc.fresh("node-0", spec, t0) and not hc.fresh("node-0", spec, time.time())
    assert {r.check: r.context for r in hc.results("node-0")} == {"ecc": BEFORE_WORK, "diag": BEFORE_WORK}
    assert rounds == [("node-0", PERIODIC), ("node-0", BEFORE_WORK)]
    assert runs(tmp_path) == [("node-0", "periodic"), ("node-0", "before_work"), ("node-0", "before_work")]
    smaller = HealthSpec(checks=[{"name": "ecc", "command": CHECK}])  # diag taken out of the configuration
    hc.run_now("node-0", smaller)
    assert [r.check for r in hc.results("node-0")] == ["ecc"]
    hc.stop()
