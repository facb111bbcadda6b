"""The signals the plane sent an attempt, from its stored stop (control/rules/blame.py): pure."""

from __future__ import annotations

from trainyard.control.rules.blame import signals_sent

TERM, KILL = 15, 9


def test_signals_sent_follow_each_stop_sequence():
    USR1, USR2 = 10, 12
    assert signals_sent(None, 0) == frozenset()
    assert signals_sent("failed", 0) == frozenset()  # asked for, nothing sent yet
    assert signals_sent("failed", 2) == {TERM} and signals_sent("cancel", 3) == {TERM, KILL}
    assert signals_sent("preempt", 1) == {USR1} and signals_sent("requeue", 3) == {USR1, TERM, KILL}
    assert signals_sent("hung", 3) == {KILL}  # straight to SIGKILL
    assert signals_sent(None, 0, "USR2@60") == {USR2} and signals_sent("timeout", 2, "B:USR1@30") == {USR1, TERM}
