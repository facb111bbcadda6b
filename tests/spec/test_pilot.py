"""The pilot pool in the configuration (spec/pilot.py, `pilot:` of spec/models.py): validation,
what a trial may change, and `effective_for`, the one answer to which settings a node runs under."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from tests.plane import TWO_TEAMS
from trainyard.spec import pilot
from trainyard.spec.models import ConfigError, ConfigSpec, parse_config

CHECK = {"name": "ecc", "command": ["true"]}


def doc(**more: Any) -> dict[str, Any]:
    d = yaml.safe_load(TWO_TEAMS.read_text())
    d["cluster"]["nodes"][0]["count"] = 3  # node-0, node-1, node-2
    d["pilot"] = {"nodes": "node-[0]"}
    d.update(more)
    return d


def spec(d: dict[str, Any]) -> ConfigSpec:
    return parse_config(yaml.safe_dump(d))


def test_pilot_nodes_are_a_hostlist_of_known_nodes_and_not_all_of_them():
    assert spec(doc(pilot={"nodes": "node-[0-1]"})).pilot.nodes == ["node-0", "node-1"]  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="pilot.nodes: unknown node 'gpu-9'"):
        spec(doc(pilot={"nodes": "gpu-9"}))
    with pytest.raises(ConfigError, match="every node is in the pilot"):
        spec(doc(pilot={"nodes": "node-[0-2]"}))
    with pytest.raises(ConfigError, match="pilot.nodes"):
        spec(doc(pilot={"nodes": "node-[0"}))
    with pytest.raises(ConfigError, match="pilot.trial.base_version"):
        spec(doc(pilot={"nodes": "node-0", "trial": {"since": 1.0}}))
    with pytest.raises(ConfigError, match="pilot.trial.features: unknown node 'x'"):
        spec(doc(pilot={"nodes": "node-0", "trial": {"since": 1.0, "base_version": 1, "features": {"x": ["a"]}}}))


def trial_doc(health: dict[str, Any] | None = None, features: dict[str, list[str]] | None = None) -> dict[str, Any]:
    t: dict[str, Any] = {"since": 100.0, "base_version": 1}
    if health is not None:
        t["health"] = health
    if features is not None:
        t["features"] = features
    return doc(pilot={"nodes": "node-0", "trial": t})


def test_a_pilot_node_runs_the_trials_checks_and_features_the_others_their_own():
    s = spec(trial_doc({"checks": [CHECK]}, {"node-0": ["ib"], "node-1": ["ib"]}))
    on, off = pilot.effective_for(s, "node-0"), pilot.effective_for(s, "node-1")
    assert on.pilot and [c.name for c in on.health.checks] == ["ecc"] and on.features == {"ib"}
    assert not off.pilot and off.health.checks == [] and off.features is None
    nodes = {n.name: n.features for n in pilot.effective_nodes(s)}
    assert nodes == {"node-0": {"ib"}, "node-1": frozenset(), "node-2": frozenset()}
    # no trial: the pilot node runs the configuration's own settings like every other
    plain = spec(doc(health={"checks": [CHECK]}))
    assert all([c.name for c in pilot.effective_for(plain, n).health.checks] == ["ecc"] for n in ("node-0", "node-2"))
    assert not pilot.effective_for(plain, "node-0").pilot


def test_a_trial_takes_health_and_features_only_and_names_what_else_differs():
    base = spec(doc())
    health, feats = pilot.trial_of(base, spec(doc(health={"checks": [CHECK]})))
    assert health is not None and [c.name for c in health.checks] == ["ecc"] and feats == {}
    d = doc()
    d["cluster"]["nodes"][0]["features"] = ["ib"]
    health, feats = pilot.trial_of(base, spec(d))
    assert health is None and feats == {"node-0": ["ib"], "node-1": ["ib"], "node-2": ["ib"]}
    for change, field in ((lambda x: x["teams"][0]["quotas"]["default"].update(nominal=1), "teams"),
                          (lambda x: x["cluster"]["nodes"][0].update(gpus=2), "cluster.nodes"),
                          (lambda x: x.update(pilot={"nodes": "node-1"}), "pilot")):
        d = doc(health={"checks": [CHECK]})
        change(d)
        with pytest.raises(pilot.Refused) as e:
            pilot.trial_of(base, spec(d))
        assert e.value.field == field and not e.value.state and "differs from the configuration in force" in str(e.value)
    with pytest.raises(pilot.Refused, match="changes nothing"):
        pilot.trial_of(base, spec(doc()))


def test_no_trial_without_a_pilot_nor_beside_another():
    plain = yaml.safe_load(TWO_TEAMS.read_text())
    with pytest.raises(pilot.Refused, match="no pilot pool") as e:
        pilot.trial_of(spec(plain), spec(dict(plain, health={"checks": [CHECK]})))
    assert e.value.state
    running = spec(trial_doc({"checks": [CHECK]}))
    with pytest.raises(pilot.Refused, match="a trial is in progress") as e:
        pilot.trial_of(running, spec(doc(health={"checks": [CHECK]})))
    assert e.value.state


def test_what_changes_says_it_in_a_line_each():
    base = spec(doc(health={"checks": [{"name": "old", "command": ["true"]}]}))
    t = copy.deepcopy(trial_doc({"interval": 30, "checks": [CHECK]}, {"node-0": ["ib"]})["pilot"]["trial"])
    s = spec(dict(doc(health={"checks": [{"name": "old", "command": ["true"]}]}),
                  pilot={"nodes": "node-0", "trial": t}))
    assert pilot.what_changes(base, s.pilot.trial) == [  # type: ignore[union-attr, arg-type]
        "check ecc added (command)", "check old removed", "health.interval: 60 -> 30",
        "node node-0: features [] -> ['ib']"]
