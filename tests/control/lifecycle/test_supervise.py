"""Supervised threads: a body that raises is restarted, each death counted and reported."""

from __future__ import annotations

import threading
import time

from trainyard.control.lifecycle import supervise
from trainyard.control.lifecycle.supervise import Supervised


def test_a_thread_that_dies_is_restarted_and_each_death_reported(monkeypatch) -> None:
    monkeypatch.setattr(supervise, "FIRST_PAUSE_S", 0.01)
    runs, deaths, stop = [], [], threading.Event()

    def body(stop_: threading.Event) -> None:
        runs.append(time.monotonic())
        if len(runs) <= 2:
            raise RuntimeError(f"boom {len(runs)}")
        stop_.wait()  # the third run lives until stopped

    th = Supervised("t", body, stop, on_death=lambda name, e: deaths.append((name, str(e))))
    th.start()
    deadline = time.monotonic() + 10
    while len(runs) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(runs) == 3 and th.alive
    assert deaths == [("t", "boom 1"), ("t", "boom 2")]
    assert (th.stats.restarts, th.stats.last_error) == (2, "RuntimeError: boom 2")
    stop.set()
    th.join(5)
    assert not th.alive


def test_a_failing_report_does_not_stop_the_restart(monkeypatch) -> None:
    monkeypatch.setattr(supervise, "FIRST_PAUSE_S", 0.01)
    runs, stop = [], threading.Event()

    def body(stop_: threading.Event) -> None:
        runs.append(1)
        if len(runs) == 1:
            raise ValueError("first")

    def report(name: str, e: BaseException) -> None:
        raise OSError("the store is gone too")

    th = Supervised("t", body, stop, on_death=report)
    th.start()
    th.join(5)
    assert len(runs) == 2 and th.stats.restarts == 1  # the second run returned: a clean end
