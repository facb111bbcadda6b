"""Each node runs its own checks (control/health/checker.py `node_spec_of`: a pilot node's trial,
spec/pilot.py), and a node's results are only those of the checks it runs now."""

from __future__ import annotations

import sys
import threading

from trainyard.control.health import CRITICAL, HealthChecker
from trainyard.spec.models import CheckSpec, HealthSpec

FAILS = CheckSpec(name="trial", command=[sys.executable, "-c", "import sys; print('bad'); sys.exit(2)"])


def test_a_check_in_one_nodes_settings_runs_there_only_and_is_forgotten_when_it_leaves(tmp_path):
    trial = {"on": True}
    base, piloted = HealthSpec(interval=0.1), HealthSpec(interval=0.1, checks=[FAILS])
    ran: list[str] = []
    rounds = threading.Event()

    def on_round(node: str, context: str) -> None:
        ran.append(node)
        rounds.set()

    hc = HealthChecker(tmp_path, lambda: base, lambda: ["node-0", "node-1"], on_round=on_round,
                       node_spec_of=lambda n: piloted if n == "node-0" and trial["on"] else base)
    hc.start()
    try:
        assert rounds.wait(10)
    finally:
        hc.stop()
    assert set(ran) == {"node-0"}  # node-1 has no check: no round at all
    assert [(r.check, r.status) for r in hc.results("node-0")] == [("trial", CRITICAL)]
    assert hc.results("node-1") == []
    trial["on"] = False  # rolled back: node-0's stale finding no longer counts
    assert hc.results("node-0") == [] and hc.fresh("node-0", base, 1e18)
    assert [r.check for r in hc.results("node-0", piloted)] == ["trial"]
