"""`yard up` says, on its standard error, what in the configuration it runs is written the old
way: the scheduler's flat parameter names of before the groups (issue 36) are read, and named."""

from __future__ import annotations

import subprocess

from tests.plane import TWO_TEAMS, YARD


def test_flat_scheduler_keys_are_read_and_warned_of_at_start(tmp_path):
    config = tmp_path / "cluster.yaml"
    config.write_text(TWO_TEAMS.read_text() + "\nscheduler:\n  params:\n    reclaim_after_s: 2m\n")
    proc = subprocess.Popen([YARD, "up", "--data-dir", str(tmp_path / "d"), "--port", "0", "--config", str(config),
                             "--login-socket", "none"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("trainyard control plane at")
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert ("warning: configuration version 1: scheduler.params.reclaim_after_s is deprecated; "
            "write it in its group: preemption: {reclaim_after_s: ...}") in err, err
