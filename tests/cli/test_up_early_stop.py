"""A SIGTERM that reaches `yard up` while it is still starting stops it (cli/up.py): the handler
used to raise SystemExit, which a weakref callback running at that moment swallowed, and the
plane ran on (3 of 12 such stops on a loaded machine). Real `yard up` processes, stopped as soon
as they print their first line."""

from __future__ import annotations

import subprocess

from tests.plane import TWO_TEAMS, YARD


def test_a_stop_during_start_up_is_never_lost(tmp_path):
    for i in range(6):
        proc = subprocess.Popen([YARD, "up", "--data-dir", str(tmp_path / f"d{i}"), "--port", "0", "--config",
                                 str(TWO_TEAMS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().startswith("trainyard control plane at")
            proc.terminate()
            proc.communicate(timeout=30)  # TimeoutExpired: the stop was lost
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode in (0, -15), proc.returncode
        assert not (tmp_path / f"d{i}" / "server.json").exists() or proc.returncode == -15
