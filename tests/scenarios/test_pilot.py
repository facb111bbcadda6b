"""The pilot pool on a real `yard up` (local backend, three emulated nodes, node-0 the pilot),
driven through the `yard` CLI as an operator would: a health check added on the pilot only runs
there and drains the pilot node that fails it and no other — though it fails on every node; `yard
cluster pilot status` shows the pilot's downs beside the rest's; `rollback` brings the node back
and the check runs nowhere; `promote` (another test) runs a check everywhere. Each step is a
configuration version with its audit event (`yard cluster history`, `yard audit`)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.plane import TWO_TEAMS, wait_until
from tests.yard_cluster import YardCluster

pytestmark = pytest.mark.slow


def marking_check(code: int) -> list[str]:
    """A check that leaves `ran-<node>` in the data dir (where it ran) and exits `code`."""
    return [sys.executable, "-c",
            "import os, sys; d, n = os.environ['TRAINYARD_DATA_DIR'], os.environ['TRAINYARD_NODE'];"
            f"open(os.path.join(d, 'ran-' + n), 'w').close(); print('pilot check on', n); sys.exit({code})"]


@pytest.fixture
def cluster(tmp_path):
    d = yaml.safe_load(TWO_TEAMS.read_text())
    d["cluster"]["nodes"][0]["count"] = 3
    d["pilot"] = {"nodes": "node-0"}
    d["health"] = {"interval": "0.3s"}
    path = tmp_path / "three.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    c = YardCluster(tmp_path, "local", config_file=path)
    yield c
    c.stop()


def states(c: YardCluster) -> dict[str, str]:
    return {n["name"]: n["state"] for n in json.loads(c.yard("nodes", "--json").stdout)}


def proposal(c: YardCluster, tmp_path: Path, check: list[str]) -> Path:
    """`yard cluster get > FILE`, with a check added: what an operator would write."""
    text = c.yard("cluster", "get").stdout
    d = yaml.safe_load(text)
    d["health"]["checks"] = [{"name": "pilot-check", "command": check, "timeout": "10s"}]
    f = tmp_path / "proposal.yaml"
    f.write_text(yaml.safe_dump(d, sort_keys=False))
    return f


def audit(c: YardCluster) -> list[dict[str, Any]]:
    out = c.yard("audit", "--kind", "config.applied,pilot.applied,pilot.promoted,pilot.rolled_back").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_a_check_tried_on_the_pilot_drains_the_pilot_node_only_and_rollback_undoes_it(cluster, tmp_path):
    c, data = cluster, cluster.data_dir
    bad = tmp_path / "bad.yaml"
    bad.write_text(c.yard("cluster", "get").stdout.replace("interval: 0.3s", "interval: soon"))
    as_apply = c.yard("cluster", "apply", str(bad), check=False)
    as_pilot = c.yard("cluster", "apply", str(bad), "--pilot", check=False)
    assert as_apply.returncode == as_pilot.returncode == 2 and as_pilot.stderr == as_apply.stderr, as_pilot.stderr
    versions_before = len(json.loads(c.yard("cluster", "history", "--json").stdout))

    c.yard("cluster", "apply", str(proposal(c, tmp_path, marking_check(2))), "--pilot", "-m", "try the pilot check")
    wait_until(lambda: states(c)["node-0"] == "down", timeout=30)
    time.sleep(2)  # several rounds (0.3 s) on every node: the others never run it
    assert states(c) == {"node-0": "down", "node-1": "up", "node-2": "up"}
    assert sorted(p.name for p in data.glob("ran-*")) == ["ran-node-0"]
    st = json.loads(c.yard("cluster", "pilot", "status", "--json").stdout)
    assert st["trial"]["changes"] == ["check pilot-check added (command)"]
    assert (st["sides"]["pilot"]["downs"], st["sides"]["rest"]["downs"]) == (1, 0)
    assert st["sides"]["rest"]["nodes"] == ["node-1", "node-2"]
    text = c.yard("cluster", "pilot", "status").stdout
    assert "check pilot-check added" in text and "downs" in text

    c.yard("cluster", "pilot", "rollback", "-m", "the check is wrong")
    wait_until(lambda: states(c)["node-0"] == "up", timeout=30)
    (data / "ran-node-0").unlink()
    time.sleep(1.5)
    assert not list(data.glob("ran-*")), "the check still runs after the rollback"
    assert states(c) == {"node-0": "up", "node-1": "up", "node-2": "up"}
    assert json.loads(c.yard("cluster", "pilot", "status", "--json").stdout)["trial"] is None

    history = json.loads(c.yard("cluster", "history", "--json").stdout)
    assert len(history) == versions_before + 2
    assert [v["message"] for v in history[:2]] == ["the check is wrong", "try the pilot check"]
    newest, trial = history[0]["version"], history[1]["version"]
    assert c.yard("cluster", "diff", str(trial - 1), str(newest)).stdout.startswith("versions")  # the same again
    kinds = [(e["kind"], e["data"].get("version")) for e in audit(c)]
    assert kinds[-4:] == [("config.applied", trial), ("pilot.applied", trial),
                          ("config.applied", newest), ("pilot.rolled_back", newest)]


def test_promote_runs_the_check_on_every_node(cluster, tmp_path):
    c, data = cluster, cluster.data_dir
    c.yard("cluster", "apply", str(proposal(c, tmp_path, marking_check(0))), "--pilot")
    wait_until(lambda: (data / "ran-node-0").exists(), timeout=30)
    time.sleep(1)
    assert sorted(p.name for p in data.glob("ran-*")) == ["ran-node-0"]
    out = c.yard("cluster", "pilot", "promote").stdout
    assert "promoted to every node" in out
    wait_until(lambda: {p.name for p in data.glob("ran-*")} == {"ran-node-0", "ran-node-1", "ran-node-2"}, timeout=30)
    assert states(c) == {"node-0": "up", "node-1": "up", "node-2": "up"}
    got = yaml.safe_load(c.yard("cluster", "get").stdout)
    assert [x["name"] for x in got["health"]["checks"]] == ["pilot-check"] and "trial" not in got["pilot"]
    assert [e["kind"] for e in audit(c)][-2:] == ["config.applied", "pilot.promoted"]
    r = c.yard("cluster", "pilot", "rollback", check=False)
    assert r.returncode == 2 and "no trial is in progress" in r.stderr
