"""The pilot's edits of the stored text (services/pilot_text.py): only their keys change, the
operators' comments stay, and taking a trial out gives back what it was put into."""

from __future__ import annotations

import yaml

from trainyard.services import pilot_text

TEXT = """# the lab's cluster
cluster:
  nodes:
    - {name: node, count: 2, gpus: 4}   # the two old ones
    - {name: big, gpus: 8, features: [nvlink]}
pilot:
  nodes: "node-[0]"  # the canaries
health:
  interval: 30s  # NHC's default
"""
TRIAL = {"since": 1.5, "base_version": 3, "health": {"interval": 30, "checks": [{"name": "x", "command": ["true"]}]},
         "features": {"node-0": ["ib"], "node-1": ["ib"], "big": []}}


def test_a_trial_goes_in_and_out_leaving_the_text_as_it_was():
    with_trial = pilot_text.with_trial(TEXT, TRIAL)
    assert "# the canaries" in with_trial and "# the two old ones" in with_trial
    assert yaml.safe_load(with_trial)["pilot"]["trial"] == TRIAL
    assert pilot_text.without_trial(with_trial) == TEXT


def test_a_flow_pilot_takes_its_trial_as_a_block():
    text = TEXT.replace('pilot:\n  nodes: "node-[0]"  # the canaries\n', 'pilot: {nodes: "node-[0]"}\n')
    with_trial = pilot_text.with_trial(text, TRIAL)
    assert "pilot:\n  nodes: \"node-[0]\"\n  trial:\n" in with_trial
    assert yaml.safe_load(pilot_text.without_trial(with_trial)) == yaml.safe_load(text)


def test_promoted_puts_the_trials_values_in_force_everywhere():
    out = pilot_text.promoted(pilot_text.with_trial(TEXT, TRIAL))
    d = yaml.safe_load(out)
    assert d["health"] == TRIAL["health"] and d["pilot"] == {"nodes": "node-[0]"}
    assert d["cluster"]["nodes"] == [{"name": "node", "count": 2, "gpus": 4, "features": ["ib"]},
                                     {"name": "big", "gpus": 8}]
    assert "# the lab's cluster" in out
