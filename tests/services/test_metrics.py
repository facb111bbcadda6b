"""services/metrics.py's `trainyard_loop_last_pass_timestamp_seconds`: the unix time the loop's
newest pass ended (TrainyardLoopStalled's age), absent before the first pass, moving as passes end
and standing still when the loop stops. Scraped from a real plane's GET /metrics."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from tests.plane import Plane, wait_until

NAME = "trainyard_loop_last_pass_timestamp_seconds"


def last_pass(p: Plane) -> float | None:
    r = p.admin.get("/metrics")
    assert r.status_code == 200, r.text
    found = [s.value for fam in text_string_to_metric_families(r.text) for s in fam.samples if s.name == NAME]
    assert len(found) <= 1, found
    return found[0] if found else None


def test_the_last_pass_time_is_unix_time_and_moves_only_while_the_loop_passes(tmp_path):
    p = Plane(tmp_path / "yard", start=False, tick_s=0.05)
    try:
        assert last_pass(p) is None  # no pass yet: no sample, rather than a made-up time
        p.cp.start()
        wait_until(lambda: last_pass(p) is not None)
        first = last_pass(p)
        assert first is not None and abs(time.time() - first) < 5
        # a later pass (the ticks are 50 ms apart), not the same one read again: each read puts the
        # monotonic time on the wall clock anew, so one pass reads a few microseconds apart
        wait_until(lambda: (last_pass(p) or 0) > first + 0.02)
    finally:
        p.cp.stop()
    stopped = last_pass(p)
    assert stopped is not None and stopped > first + 0.01
    time.sleep(0.3)  # six ticks with no loop: the time stands
    assert abs((last_pass(p) or 0) - stopped) < 0.05  # the same pass (two clocks read a moment apart)
