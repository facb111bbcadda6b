"""A smaller run of bench/api_load.py (its figures are the benchmark's; this asserts behaviour):
many concurrent clients with log followers against a real `yard up` get answers or a 503 with
Retry-After, never a timeout or another 5xx; jobs submitted meanwhile start; and a SIGTERM under
that load stops the server, leaving its job running for the next `yard up` to re-attach."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "api_load.py"
pytestmark = pytest.mark.slow


def run_bench(*args: str) -> dict:
    done = subprocess.run([sys.executable, str(BENCH), "--json", *args], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip(), done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_concurrent_clients_and_followers_get_answers_not_timeouts():
    out = run_bench("--clients", "40", "--followers", "8", "--seconds", "10")
    assert (out["timeouts"], out["other_5xx"], out["transport_errors"]) == (0, 0, 0), out["notes"]
    assert out["requests_ok"] > 40 and out["follower_bytes"] > 0
    assert out["probes"] >= 1 and out["probe_start_max_s"] != float("inf"), out["notes"]
    assert out["healthz_ok"] is True and out["leftover_processes"] == 0


def test_sigterm_under_load_stops_the_server_and_the_next_start_reattaches():
    out = run_bench("--clients", "30", "--followers", "6", "--seconds", "10", "--sigterm")
    assert out["exit_code"] is not None, "yard up did not exit within 60 s of SIGTERM"
    assert out["reattached"] is True, out
