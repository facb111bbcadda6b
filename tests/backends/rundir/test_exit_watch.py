"""ExitWatch (backends/rundir/exit_watch.py): news of a rank's new exit record, once per record."""

from __future__ import annotations

import threading
from pathlib import Path

from trainyard.backends.rundir.exit_watch import ExitWatch


def test_each_new_exit_record_is_news_once_and_released_attempts_are_forgotten(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    known = [(a, 2), (b, 1)]
    w = ExitWatch(lambda: list(known), lambda: None, interval_s=3600)  # looks by hand below
    try:
        assert not w.look()
        (a / "rank-1.exit").write_text("{}")
        assert w.look()
        assert not w.look()  # the same record is no news
        (a / "rank-0.exit").write_text("{}")
        (b / "rank-0.exit").write_text("{}")
        assert w.look() and not w.look()
        known.remove((b, 1))  # released
        assert not w.look()
        (a / "rank-5.exit").write_text("{}")  # not a rank of the attempt
        assert not w.look()
    finally:
        w.stop()


def test_the_thread_wakes_the_loop_when_a_rank_ends(tmp_path: Path) -> None:
    woken = threading.Event()
    w = ExitWatch(lambda: [(tmp_path, 1)], woken.set, interval_s=0.01)
    try:
        assert not woken.wait(0.2)
        (tmp_path / "rank-0.exit").write_text("{}")
        assert woken.wait(10)
    finally:
        w.stop()
