"""`images/tools.py`: a tool runs with a clean environment, a timeout, its output bounded; a
missing one is TOOL_MISSING."""

from __future__ import annotations

import os
import time

import pytest

from trainyard.images import tools
from trainyard.images.types import TOOL_MISSING, UNREACHABLE, ImagePullError


def test_a_missing_tool_is_named():
    with pytest.raises(ImagePullError) as e:
        tools.run(["no-such-tool-skopeo"], timeout=5, image="x/y:1")
    assert e.value.kind == TOOL_MISSING and e.value.registry_fault
    assert "no-such-tool-skopeo is not installed" in str(e.value) and str(e.value).startswith("x/y:1: ")


def test_the_environment_is_minimal_and_home_private(monkeypatch):
    monkeypatch.setenv("TRAINYARD_SECRET_TOKEN", "do-not-leak")
    result = tools.run(["env"], timeout=10)
    env = dict(line.split("=", 1) for line in result.stdout.decode().splitlines())
    assert set(env) == {"PATH", "LANG", "HOME", "TMPDIR"}
    assert env["LANG"] == "C" and env["HOME"] != os.environ.get("HOME")
    assert not os.path.exists(env["HOME"])  # the private HOME went with the call


def test_a_hanging_tool_is_killed_at_its_timeout():
    start = time.monotonic()
    with pytest.raises(ImagePullError) as e:
        tools.run(["sh", "-c", "sleep 30 & sleep 30"], timeout=0.5, image="img")
    assert e.value.kind == UNREACHABLE and "ran past 0.5 s" in str(e.value)
    assert time.monotonic() - start < 5


def test_output_is_bounded():
    result = tools.run(["sh", "-c", "head -c 5000000 /dev/zero | tr '\\0' x >&2; head -c 300000 /dev/zero"],
                       timeout=30, stdout_max=1000)
    assert len(result.stderr) <= tools.OUTPUT_MAX + 16
    assert len(result.stdout) == 1000 and result.truncated
