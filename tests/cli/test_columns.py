"""The fitting of columns to a width (cli/columns.py) and the clock of the queue (cli/render.py)."""

from __future__ import annotations

import time

from trainyard.cli.columns import MIN_CUT, Column, render
from trainyard.cli.render import clock

COLS = [Column("ID"), Column("NAME", cut=True), Column("USER"), Column("REASON", cut=True)]
ROW = ["123456", "n" * 40, "alexandra", "r" * 60]


def test_only_cut_columns_give_up_width_the_widest_first():
    lines = render(COLS, [ROW], width=60)
    assert all(len(line) <= 60 for line in lines)
    cells = lines[1].split()
    assert cells[0] == "123456" and cells[2] == "alexandra"
    assert cells[1].endswith("…") and cells[3].endswith("…") and len(cells[1]) == len(cells[3])


def test_too_narrow_for_the_whole_columns_gives_a_long_line_never_a_hidden_id():
    line = render(COLS, [ROW], width=20)[1]
    assert line.split()[0] == "123456" and line.split()[2] == "alexandra" and len(line.split()[1]) == MIN_CUT


def test_no_width_cuts_nothing():
    assert render(COLS, [ROW], width=None)[1].split() == ROW


def test_a_time_not_today_shows_its_date():
    now = time.mktime((2026, 12, 2, 23, 0, 0, 0, 0, -1))
    assert clock(now + 1800, now) == time.strftime("%H:%M:%S", time.localtime(now + 1800))
    assert clock(now + 7200, now) == "12-03T01:00"  # two hours on, but tomorrow
    assert clock(now - 86400, now) == "12-01T23:00"
    assert clock(time.mktime((2027, 1, 5, 8, 0, 0, 0, 0, -1)), now) == "2027-01-05T08:00"
    assert clock(None, now) == ""
