"""`yard nodes` marks a node a straggler suspicion holds (cli/admin.py `state_word`): `up+suspect`,
the suspicion's reason beside the node's own. The suspicion itself: tests/control/loop/test_stragglers.py."""

from __future__ import annotations

from trainyard.cli.admin import state_word


def test_a_suspect_node_reads_state_plus_suspect_and_a_plain_one_its_state() -> None:
    assert state_word({"state": "up", "suspect_since": 1.0}) == "up+suspect"
    assert state_word({"state": "drain", "suspect_since": 0.0}) == "drain+suspect"  # 0.0 is a time, not "none"
    assert state_word({"state": "up", "suspect_since": None}) == "up"
    assert state_word({"state": "down"}) == "down"  # a plane before issue 39 sends no such field
