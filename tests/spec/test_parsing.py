"""`parse_begin`: start times as `sbatch --begin` takes them, in this machine's time zone."""

from __future__ import annotations

import datetime as dt

import pytest

from trainyard.spec.parsing import parse_begin

NOW = dt.datetime(2026, 12, 1, 10, 30, 15).astimezone().timestamp()  # 10:30:15 here


@pytest.mark.parametrize("text,offset", [
    ("now", 0), ("today", 0), ("NOW+90", 90), ("now+90s", 90), ("now+30minutes", 1800), ("now+2hours", 7200),
    ("now+1days", 86400), ("now+1week", 604800), ("now+5m", 300),
])
def test_relative_times(text, offset):
    assert parse_begin(text, NOW) == NOW + offset


def at(day: int, h: int, m: int = 0, s: int = 0) -> float:
    return dt.datetime(2026, 12, day, h, m, s).astimezone().timestamp()


@pytest.mark.parametrize("text,want", [
    ("16:00", at(1, 16)), ("10:30:16", at(1, 10, 30, 16)), ("09:00", at(2, 9)),  # today if still ahead, else tomorrow
    ("10:30:15", at(2, 10, 30, 15)), ("midnight", at(2, 0)), ("tomorrow", at(2, 0)), ("noon", at(1, 12)),
    ("teatime", at(1, 16)), ("2026-12-24", at(24, 0)), ("2026-12-24T08:00", at(24, 8)),
    ("2026-12-24t08:00:30", at(24, 8, 0, 30)),
])
def test_absolute_times(text, want):
    assert parse_begin(text, NOW) == want


@pytest.mark.parametrize("text,words", [
    ("now+3parsecs", "unknown unit 'parsecs'"), ("25:00", "not a time of day"), ("2026-13-01", "not a date"),
    ("soon", "cannot read 'soon' as a start time"), ("now-5", "cannot read"), ("", "cannot read"),
])
def test_what_cannot_be_read_is_named(text, words):
    with pytest.raises(ValueError) as e:
        parse_begin(text, NOW)
    assert words in str(e.value)
