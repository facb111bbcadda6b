"""Picking the containment mode: detection on this machine, the explicit override, and a plane
that cannot create cgroups (its cgroup mounts made read-only in a private mount namespace, so
the rest of the machine is untouched) saying so at `yard up`."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.plane import TWO_TEAMS, YARD
from trainyard.backends import contain
from trainyard.backends.contain import mounts

READ_ONLY_CGROUPS = ('for m in $(awk \'$9 ~ /^cgroup/ {print $5}\' /proc/self/mountinfo); do '
                     'mount -o remount,bind,ro "$m" || exit 99; done; exec "$@"')
can_unshare = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                 reason="needs root and unshare(1) for a private mount namespace")


def test_an_unknown_mode_is_an_error_naming_the_choices(tmp_path):
    with pytest.raises(contain.ContainmentError, match="unknown mode 'cgroups'.*auto, cgroup2, cgroup1, subreaper"):
        contain.choose("cgroups", str(tmp_path))


def test_the_environment_names_the_mode_and_an_argument_wins_over_it(tmp_path, monkeypatch):
    monkeypatch.setenv(contain.ENV, "subreaper")
    assert contain.choose(None, str(tmp_path)).mode == "subreaper"
    if os.geteuid() == 0 and mounts.find().v2 is not None:
        assert contain.choose("cgroup2", str(tmp_path)).mode == "cgroup2"


def test_auto_on_this_machine_takes_the_best_that_works_and_says_why_not_better(tmp_path):
    found = mounts.find()
    choice = contain.choose("auto", str(tmp_path))
    if os.geteuid() == 0 and "freezer" in found.v1 and choice.mode == "cgroup1":
        assert "fallback: cgroup2" in choice.line()  # hybrid: the unified hierarchy lacks the controllers
    assert choice.line().startswith(f"containment: {choice.mode}")


def test_the_plane_s_own_cgroup_is_found_under_a_mount_of_a_subtree(tmp_path):
    # A container sees its cgroup as "/" of a mount whose root is its path in the hierarchy.
    (tmp_path / "mountinfo").write_text(
        "35 31 0:32 /process_api/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n")
    (tmp_path / "cgroup").write_text("4:memory:/process_api/abc/inner\n0::/\n")
    found = mounts.find(str(tmp_path / "mountinfo"), str(tmp_path / "cgroup"))
    assert found.v1 == {"memory": "/sys/fs/cgroup/memory/inner"} and found.v2 == "/sys/fs/cgroup/unified"


def _yard_up(tmp_path: Path, mode: str) -> subprocess.Popen:
    env = {**os.environ, contain.ENV: mode, "PYTHONUNBUFFERED": "1"}  # its start lines as they come
    args = [YARD, "up", "--data-dir", str(tmp_path / "yard"), "--port", "0", "--config", str(TWO_TEAMS)]
    return subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", READ_ONLY_CGROUPS, "sh", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@can_unshare
def test_a_plane_that_cannot_create_cgroups_and_was_asked_for_cgroup1_refuses_to_start(tmp_path):
    proc = _yard_up(tmp_path, "cgroup1")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, (out, err)
    assert "cgroup1 needs a writable freezer hierarchy" in err and "Read-only file system" in err


@can_unshare
def test_a_plane_that_cannot_create_cgroups_falls_back_to_subreaper_and_says_so(tmp_path):
    proc = _yard_up(tmp_path, "auto")
    try:
        lines = []
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("containment:"):
                break
        assert lines and lines[-1].startswith("containment: subreaper"), "".join(lines)
        assert "[fallback: cgroup2: cannot create" in lines[-1] and "Read-only file system" in lines[-1]
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
