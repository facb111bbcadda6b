"""The what-if on a real `yard up` (issue 40's acceptance): a recorded day of a synthetic 3-team
workload in the plane's store (`tests/sim/recorded_day.py`, written through the store's models
while the plane is down), then, through the `yard` CLI as an admin types it:

- `yard cluster apply half-quota.yaml --what-if` shows team-a's p99 wait rising and team-b's and
  team-c's falling, and stores no version;
- `yard trace export` + `yard sim --format trainyard --config in-force.yaml` gives exactly the
  what-if's figures for the configuration in force (every metric but the simulator's wall time,
  and every team's and class's figures);
- an invalid file is refused with apply's own error, exit 2, nothing stored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from tests.sim.recorded_day import half_quota, yard_up_with_a_recorded_day
from tests.yard_cluster import YardCluster

# two starts of `yard up`, a dozen `yard` commands and a `yard sim`: 30-60 s; one cluster for the module
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("whatif-yard-up")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[YardCluster]:
    with yard_up_with_a_recorded_day(tmp_path_factory.mktemp("whatif-up")) as c:
        yield c


def versions(c: YardCluster) -> list[dict]:
    return json.loads(c.yard("cluster", "history", "--json").stdout)


def in_force(c: YardCluster, tmp: Path) -> Path:
    path = tmp / "in-force.yaml"
    path.write_text(json.loads(c.yard("cluster", "get", "--json").stdout)["text"])
    return path


def test_halving_team_a_on_yard_up_and_yard_sim_on_the_export_agree(cluster: YardCluster, tmp_path: Path) -> None:
    before = versions(cluster)
    current = in_force(cluster, tmp_path)
    proposal = tmp_path / "half-quota.yaml"
    proposal.write_text(half_quota(current.read_text()))
    doc = json.loads(cluster.yard("cluster", "apply", str(proposal), "--what-if", "--since", "now-3days", "--json").stdout)
    a, b = doc["in_force"]["teams"], doc["proposed"]["teams"]
    assert doc["jobs"] == 100
    assert b["team-a"]["p99_wait_s"] > a["team-a"]["p99_wait_s"]
    assert b["team-b"]["p99_wait_s"] < a["team-b"]["p99_wait_s"] and b["team-c"]["p99_wait_s"] < a["team-c"]["p99_wait_s"]
    table = cluster.yard("cluster", "apply", str(proposal), "--what-if", "--since", "now-3days").stdout
    assert "nothing applied" in table and "team team-a" in table and "p99_wait_s" in table and "class batch" in table
    assert versions(cluster) == before

    trace = tmp_path / "history.jsonl"
    cluster.yard("trace", "export", "--since", "now-3days", "--out", str(trace))
    assert len(trace.read_text().splitlines()) == 100
    report = tmp_path / "report"
    cluster.yard("sim", "--trace", str(trace), "--format", "trainyard", "--config", str(current),
                 "--policies", "trainyard", "--out", str(report), timeout=120)
    rep = json.loads((report / "report.json").read_text())
    sim, whatif = rep["policies"]["trainyard"], doc["in_force"]["metrics"]
    assert {k: v for k, v in sim.items() if k != "sim_wall_s"} == {k: v for k, v in whatif.items() if k != "sim_wall_s"}
    assert rep["breakdown"]["trainyard"] == {"teams": doc["in_force"]["teams"], "classes": doc["in_force"]["classes"]}


def test_an_invalid_what_if_file_is_refused_as_apply_refuses_it(cluster: YardCluster, tmp_path: Path) -> None:
    before = versions(cluster)
    bad = tmp_path / "bad.yaml"
    bad.write_text(in_force(cluster, tmp_path).read_text().replace("{nominal: 8}", "{nominal: -8}"))
    what_if = cluster.yard("cluster", "apply", str(bad), "--what-if", check=False)
    applied = cluster.yard("cluster", "apply", str(bad), check=False)
    assert what_if.returncode == applied.returncode == 2
    assert what_if.stderr == applied.stderr and "nominal" in what_if.stderr
    assert cluster.yard("cluster", "apply", str(bad), "--since", "now-1days", check=False).returncode == 2
    assert cluster.yard("cluster", "apply", str(bad), "--what-if", "--since", "someday", check=False).returncode == 2
    assert versions(cluster) == before
