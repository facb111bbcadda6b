"""The pieces of `rundir/attach.py` that need no rank: bounded reads that follow no link and open
no FIFO, the rank's process told from a recycled pid, the default shell, the usage line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard.backends.rundir import attach


def _start(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rindex(")") + 2:].split()[19])


def test_a_record_is_read_bounded_and_never_through_a_link_or_a_fifo(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 5000)
    assert len(attach.read_bounded(str(tmp_path / "big"), 100)) == 100
    (tmp_path / "link").symlink_to(tmp_path / "big")
    with pytest.raises(OSError):
        attach.read_bounded(str(tmp_path / "link"), 100)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError, match="not a regular file"):
        attach.read_bounded(str(tmp_path / "fifo"), 100)  # opened without blocking, then refused


def _run_dir(tmp_path: Path, rec: dict) -> Path:
    (tmp_path / "rank-0.json").write_text(json.dumps(rec))
    return tmp_path


def test_the_ranks_process_must_be_the_runners_own_child_still_running(tmp_path):
    # this test process plays the runner, a child of it the rank's command
    me = os.getpid()
    child = subprocess.Popen(["sleep", "30"])
    try:
        rec = {"pid": me, "start_time": _start(me), "child_pid": child.pid}
        assert attach.rank_process(str(_run_dir(tmp_path, rec)), 0) == (child.pid, _start(child.pid))
        with pytest.raises(attach.Refused, match="is another process now"):
            attach.rank_process(str(_run_dir(tmp_path, {**rec, "child_start_time": 1})), 0)
        with pytest.raises(attach.Refused, match="is another process now"):  # alive, not the runner's child
            attach.rank_process(str(_run_dir(tmp_path, {**rec, "child_pid": os.getppid()})), 0)
        with pytest.raises(attach.Refused, match="its runner, pid"):
            attach.rank_process(str(_run_dir(tmp_path, {**rec, "start_time": 1})), 0)
        (tmp_path / "rank-0.exit").write_text("{}")
        with pytest.raises(attach.Refused, match="rank 0 has ended"):
            attach.rank_process(str(_run_dir(tmp_path, rec)), 0)
    finally:
        child.kill()
        child.wait()


def test_the_default_shell_is_the_ranks_then_bash_then_sh():
    assert attach.default_shell({"SHELL": "/bin/sh"}) == ["/bin/sh"]
    assert attach.default_shell({"SHELL": "/no/such/shell"}) in (["/bin/bash"], ["/bin/sh"])
    assert attach.default_shell({"SHELL": "relative"}) in (["/bin/bash"], ["/bin/sh"])


def test_a_missing_plan_is_one_line_and_126(tmp_path):
    r = subprocess.run([sys.executable, "-I", "-S", attach.__file__, str(tmp_path), "0", "--", "true"],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert r.returncode == 126
    assert r.stderr.count("\n") == 1 and "cannot read the attempt's plan" in r.stderr, r.stderr
