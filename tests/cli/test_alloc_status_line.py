"""cli/alloc.py's waiting line: redrawn in place on a terminal (state, reason, estimated start, time
waited), one plain line per change otherwise."""

from __future__ import annotations

import io
import time

import pytest

from trainyard.cli import alloc


def _job(state: str = "PENDING", reason: str = "Resources", est: float | None = None) -> dict:
    return {"state": state, "reason": reason, "est_start": est}


def test_on_a_terminal_the_line_is_redrawn_with_the_estimate_and_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    line = alloc.StatusLine("salloc", 7, live=True)
    line.show(_job(est=time.time() + 125), 3)
    line.show(_job(est=time.time() + 124), 4)
    line.done()
    out = err.getvalue()
    assert out.count("\r\x1b[K") == 3 and "\n" not in out
    assert "salloc: job 7 PENDING (Resources), estimated start " in out and "(in 2:0" in out
    assert out.endswith("waiting 0:04\r\x1b[K")


def test_in_a_pipe_a_line_per_change_only(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    line = alloc.StatusLine("srun", 8, live=False)
    for j in (_job(reason="None"), _job(reason="None"), _job(), _job(), _job(state="CONFIGURING", reason="ImagePull")):
        line.show(j, 1)
    line.done()
    err = capsys.readouterr().err
    assert err.splitlines() == ["srun: job 8 PENDING", "srun: job 8 PENDING (Resources)",
                                "srun: job 8 CONFIGURING (ImagePull)"]
