"""Paths a member controls, swapped between two steps of a launch (issue 34: "root writes where the
member points"). Only the API and her own jobs: an earlier job of hers (`afterany`) swaps her
working directory, or a directory on her `--output` path, for a link to a directory of root's
between the submission (where the plane checked it) and the launch. The plane makes the `--output`
links as her (`jobfs.as_owner`) and the rank enters the working directory as her (the runner), so
the kernel refuses what she could not do herself; checkpoint markers behind links count for nothing.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.accounts import ROOT_ONLY
from tests.security.hostile import Yard, yard

pytestmark = [ROOT_ONLY, pytest.mark.slow, pytest.mark.xdist_group("security-paths")]


@pytest.fixture(scope="module")
def y():
    with yard("ty-sec-paths-") as y:
        yield y


def _swap(y: Yard, work: str, to: str) -> int:
    """Alice's own job that replaces her working directory `work` with a link to `to`."""
    return y.submit("alice", ["/bin/sh", "-c", f'mv "{work}" "{work}.real" && ln -s "{to}" "{work}" && echo swapped'],
                    workdir=str(y.home("alice")))


def test_a_workdir_swapped_for_a_link_to_roots_directory_gets_nothing_made_there(y):
    """The stand-in for /etc/profile.d: root's, 0755. Before: root made `out/` (hers) and a link
    she controls inside it."""
    stand_in = y.base / "profile.d"
    stand_in.mkdir(mode=0o755)
    work = y.home("alice") / "work"
    work.mkdir()
    os.chown(work, y.acc.uid("alice"), y.acc.gid("vis"))
    swap = _swap(y, str(work), str(stand_in))
    victim = y.submit("alice", ["/bin/sh", "-c", "echo ran"], workdir=str(work), output="out/%j.log",
                      dependency=f"afterany:{swap}")
    assert y.ended(swap)["state"] == "COMPLETED" and os.path.islink(work), y.log(swap)
    y.ended(victim)
    assert list(stand_in.iterdir()) == [], "the plane made something in root's directory"


def test_a_workdir_swapped_for_a_link_into_roots_private_tree_is_not_entered(y):
    """Root's 0700 directory with a readable subdirectory: the rank must not start in it (root's
    chdir followed by setuid used to leave her inside, reading what she cannot reach)."""
    private = y.base / "private"
    private.mkdir(mode=0o700)
    (private / "pub").mkdir(mode=0o755)
    (private / "pub" / "secret.txt").write_text("root-only-secret\n")
    (private / "pub" / "secret.txt").chmod(0o644)
    work = y.home("alice") / "work2"
    work.mkdir()
    os.chown(work, y.acc.uid("alice"), y.acc.gid("vis"))
    swap = _swap(y, str(work), str(private / "pub"))
    victim = y.submit("alice", ["/bin/sh", "-c", "cat secret.txt"], workdir=str(work), dependency=f"afterany:{swap}")
    assert y.ended(swap)["state"] == "COMPLETED", y.log(swap)
    job = y.ended(victim)
    assert "root-only-secret" not in y.log(victim)
    assert job["state"] == "FAILED" and "cannot enter the working directory" in job["reason"], job["reason"]


def test_a_directory_on_the_output_path_swapped_for_a_link_gets_nothing_made_through_it(y):
    stand_in = y.base / "cron.d"
    stand_in.mkdir(mode=0o755)
    work = y.home("alice") / "work3"
    (work / "logs").mkdir(parents=True)
    for d in (work, work / "logs"):
        os.chown(d, y.acc.uid("alice"), y.acc.gid("vis"))
    swap = y.submit("alice", ["/bin/sh", "-c", f'rmdir "{work}/logs" && ln -s "{stand_in}" "{work}/logs"'],
                    workdir=str(work))
    victim = y.submit("alice", ["/bin/sh", "-c", "echo ran"], workdir=str(work), output="logs/deeper/%j.log",
                      dependency=f"afterany:{swap}")
    assert y.ended(swap)["state"] == "COMPLETED", y.log(swap)
    assert y.ended(victim)["state"] == "COMPLETED", y.log(victim)
    assert list(stand_in.iterdir()) == []


def test_checkpoint_markers_behind_links_count_for_nothing(y):
    """A job that points `step-N` (or its COMMITTED marker) at root's files: the plane records no
    checkpoint from them (nor reads them: it never follows a link in the job's directory)."""
    elsewhere = y.base / "ckpt-root"
    (elsewhere / "step-7").mkdir(parents=True)
    (elsewhere / "step-7" / "COMMITTED").touch()
    root_marker = y.base / "root-marker"
    root_marker.touch()
    body = (f'sleep 1; ln -s "{elsewhere}/step-7" "$TRAINYARD_CHECKPOINT_DIR/step-99"; '
            f'mkdir "$TRAINYARD_CHECKPOINT_DIR/step-50"; ln -s "{root_marker}" "$TRAINYARD_CHECKPOINT_DIR/step-50/COMMITTED"; '
            "touch \"$TRAINYARD_CHECKPOINT_DIR/step-50\"; sleep 2; exit 3")
    for marker in (root_marker, elsewhere / "step-7" / "COMMITTED"):  # newer than the attempt's start
        os.utime(marker, (time.time() + 30, time.time() + 30))
    j = y.submit("alice", ["/bin/sh", "-c", body], workdir=str(y.home("alice")))
    job = y.ended(j)
    assert job["state"] == "FAILED" and job["last_checkpoint"] is None, job


def test_an_output_outside_the_workdir_goes_where_she_may_write_and_nowhere_else(y):
    """Slurm writes a job's output anywhere its user may (issue 35): the link is made as her, so
    her own directory elsewhere takes it, root's does not (refused at submit, made nowhere)."""
    roots = y.base / "var-log"
    roots.mkdir(mode=0o755)
    alice = y.plane.as_user("alice", "member", "vision")
    r = alice.post("/api/v1/jobs", json={"command": ["/bin/sh", "-c", "echo x"], "team": "vision",
                                         "workdir": str(y.home("alice")), "output": f"{roots}/%j.log"})
    assert r.status_code == 400 and r.json()["field"] == "output" and "Permission denied" in r.json()["detail"]
    logs = y.base / "alice-scratch"
    logs.mkdir()
    os.chown(logs, y.acc.uid("alice"), y.acc.gid("vis"))
    j = y.submit("alice", ["/bin/sh", "-c", "echo to-scratch"], workdir=str(y.home("alice")),
                 output=f"{logs}/deep/%x-%j.log")
    assert y.ended(j)["state"] == "COMPLETED"
    link = logs / "deep" / f"sh-{j}.log"
    assert link.is_symlink() and os.lstat(link).st_uid == y.acc.uid("alice") and "to-scratch" in link.read_text()
    assert list(roots.iterdir()) == []
