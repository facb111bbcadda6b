"""What the CLI prints of other people's text: control characters escaped in tables and plain
lines, Rich markup shown as text, JSON untouched; and `--output` refused before anything is
created. A real `yard` process against a real `yard up`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.plane import YARD, YardServer
from trainyard.cli.safe_text import clean

NAME = "\x1b[2J\x1b]0;owned\x07evil\rname [red]x[/red]"
REASON = "\x1b[31mfirmware\x1b[0m\u202egnp.exe\x9b1m"


# One worker for this module's tests under `make test`'s --dist loadgroup: its module-scoped
# yard up starts once, not once per worker (about 4 s of CPU each).
pytestmark = pytest.mark.xdist_group("cli-safe-text")


@pytest.fixture(scope="module")
def yard(tmp_path_factory):
    server = YardServer(tmp_path_factory.mktemp("safe") / "yard")
    server.data_dir.mkdir()
    server.start()
    env = {**os.environ, "YARD_URL": server.url, "YARD_TOKEN": server.token}

    def run(*args: str, ok: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess:
        p = subprocess.run([YARD, *args], capture_output=True, text=True, env=env, cwd=cwd or server.data_dir,
                           timeout=60)
        if ok:
            assert p.returncode == 0, f"yard {' '.join(args)} → {p.returncode}\n{p.stdout}\n{p.stderr}"
        return p

    run.server = server  # type: ignore[attr-defined]
    yield run
    for j in json.loads(run("queue", "--json").stdout):
        run("cancel", str(j["id"]), ok=False)
    run("resume", "node-1", ok=False)
    server.terminate()


def raw_controls(text: str) -> list[str]:
    return sorted({c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) <= 0x9f or c == "\u202e"})


def test_clean_escapes_controls_and_keeps_printable_text():
    assert clean("a\x1b[2Jb\rc\td\x00e\x7f\x9b\u202ef\u2028") == "a\\x1b[2Jb\\rc\\td\\x00e\\x7f\\x9b\\u202ef\\u2028"
    assert clean("plain words, ümlaut, 日本, 🚀") == "plain words, ümlaut, 日本, 🚀"
    assert clean(None) == "" and clean(42) == "42"


def test_names_commands_reasons_and_events_reach_the_terminal_escaped(yard):
    jid = int(yard("submit", "--parsable", "-H", "-A", "vision", "-J", NAME, "--", "echo", "\x1b]8;;http://x\x1b\\hi").stdout)
    yard("drain", "node-1", "--reason", REASON)
    outputs = {
        "queue": yard("queue").stdout,
        "show": yard("show", str(jid)).stdout,
        "events": yard("events").stdout,
        "job events": yard("events", str(jid)).stdout,
        "nodes": yard("nodes").stdout,
        "hold": yard("hold", str(jid), ok=False).stdout + yard("release", str(jid)).stdout,
    }
    for what, out in outputs.items():
        assert raw_controls(out) == [], (what, out)
    assert "\\x1b[2J\\x1b]0;owned\\x07evil\\rname" in outputs["show"]
    assert "[red]x[/red]" in outputs["show"]  # text, not Rich markup
    assert "\\x1b]8;;http://x\\x1b\\hi" in outputs["show"]  # the command's hyperlink sequence, shown
    assert "\\x1b[31mfirmware" in outputs["nodes"] and "\\u202egnp.exe" in outputs["nodes"]
    assert "\\x1b[31mfirmware" in outputs["events"]
    assert "\\x1b[2J" in outputs["queue"]  # (the queue cuts names at 20 characters: this much shows)
    # JSON stays raw JSON: a script gets the values exactly.
    assert json.loads(yard("show", str(jid), "--json").stdout)["name"] == NAME
    node = next(n for n in json.loads(yard("nodes", "--json").stdout) if n["name"] == "node-1")
    assert node["reason"].startswith(REASON)
    yard("cancel", str(jid), ok=False)  # (released above: it may have run already)


def test_many_rows_are_escaped_too(yard):
    """Above 200 rows the table is plain text, not Rich: the same escaping."""
    out = yard("events", "-n", "1000").stdout
    assert raw_controls(out) == []


def test_an_output_that_cannot_be_linked_is_refused_before_any_directory_is_made(yard, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    taken = tmp_path / "elsewhere" / "taken.log"
    taken.parent.mkdir()
    taken.write_text("keep")
    before = len(json.loads(yard("queue", "--all", "--json").stdout))
    bad = yard("submit", "-A", "vision", "-o", str(taken), "--", "true", ok=False, cwd=work)
    assert bad.returncode == 2 and "field 'output'" in bad.stderr and "exists and is not a link" in bad.stderr
    assert taken.read_text() == "keep"
    (work / "link").symlink_to(tmp_path)
    bad = yard("submit", "-A", "vision", "-o", "link/made/%j.log", "--", "true", ok=False, cwd=work)
    assert bad.returncode == 2 and "is a symbolic link" in bad.stderr
    assert not (tmp_path / "made").exists()
    assert len(json.loads(yard("queue", "--all", "--json").stdout)) == before  # nothing was stored
    ok = int(yard("submit", "--parsable", "-A", "vision", "-o", "logs/%j.log", "--", sys.executable, "-c",
                  "print('linked')", cwd=work).stdout)
    deadline = time.monotonic() + 30
    while json.loads(yard("show", str(ok), "--json").stdout)["state"] != "COMPLETED":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert "linked" in (work / "logs" / f"{ok}.log").read_text()
    # Outside the working directory, wherever the owner may write (here: the test's account).
    far = int(yard("submit", "--parsable", "-A", "vision", "-o", f"{tmp_path}/far/deep/%j.log", "--",
                   sys.executable, "-c", "print('far')", cwd=work).stdout)
    while json.loads(yard("show", str(far), "--json").stdout)["state"] != "COMPLETED":
        assert time.monotonic() < deadline + 30
        time.sleep(0.2)
    assert "far" in (tmp_path / "far" / "deep" / f"{far}.log").read_text()
