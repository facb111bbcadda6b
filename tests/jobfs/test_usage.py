"""`jobfs.UsageWalk` (and `Tree.disk_usage`, which runs one): what a job's tree holds, counted as
`du -sx` counts it, whatever shape the job gives the tree. Each case is checked against GNU du on
the same files. The attacks: a directory of thousands of subdirectories (a walk that held one
descriptor per waiting subdirectory ran out of them and reported the rest as nothing, complete), a
tree deeper than the descriptors a walk may hold, a million empty files in front of the bytes (a
walk cut at the same place every time never reached them), and directories moved or swapped for
links between two runs."""

from __future__ import annotations

import os
import resource
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from trainyard import jobfs
from trainyard.jobfs import usage


def du(path: Path) -> int:
    """GNU du's bytes for what is under `path` (its own directory's blocks taken off)."""
    out = subprocess.run(["du", "-s", "-x", "-B1", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) - os.lstat(path).st_blocks * 512


@contextmanager
def descriptors(n: int) -> Iterator[None]:
    """This process may hold at most `n` descriptors meanwhile (a plane under systemd has 1024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def fill(path: Path, n: int = 65536) -> None:
    path.write_bytes(os.urandom(n))


def test_thousands_of_subdirectories_are_counted_with_few_descriptors(tmp_path):
    job = tmp_path / "job"
    for i in range(1500):
        (job / f"d{i}").mkdir(parents=True)
        fill(job / f"d{i}" / "f")
    with descriptors(200):  # before: the walk opened all 1500 at once and counted 170 of them, "complete"
        used, complete = jobfs.Tree(tmp_path).disk_usage("job")
    assert complete and used == du(job) and used > 1500 * 65536


def test_a_tree_deeper_than_the_descriptors_a_walk_holds_is_counted_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(usage, "USAGE_OPEN_DIRS", 4)
    here = job = tmp_path / "job"
    for depth in range(120):
        here = here / "d"
        here.mkdir(parents=True)
        if depth % 10 == 0:
            fill(here / "f")
            (here / "side").mkdir()  # a second way down at this level: walked after coming back up
            fill(here / "side" / "g")
    with descriptors(64):
        used, complete = jobfs.Tree(tmp_path).disk_usage("job")
    assert complete and used == du(job)


def test_a_walk_in_slices_goes_on_where_it_stopped_and_reaches_the_bytes_behind_many_files(tmp_path):
    job = tmp_path / "job"
    many = job / "many"  # its subdirectories are walked after its 3000 entries, whatever their order
    (many / "ck" / "step-1").mkdir(parents=True)
    for i in range(3000):
        (many / f"e{i}").touch()
    fill(many / "ck" / "step-1" / "model.pt", 4 << 20)
    os.link(many / "ck" / "step-1" / "model.pt", many / "ck" / "again.pt")
    (many / "ck" / "outside").symlink_to("/usr")  # never followed
    walk, runs = jobfs.UsageWalk(jobfs.Tree(tmp_path), "job"), 0
    while not walk.run(max_entries=700):
        runs += 1
        assert runs < 20
    assert runs >= 4 and walk.whole and walk.total == du(job) and walk.entries == 3000 + 6
    fresh = jobfs.UsageWalk(jobfs.Tree(tmp_path), "job")
    assert not fresh.run(max_entries=700) and fresh.total < 4 << 20  # one slice alone: short of the bytes


def test_a_directory_moved_or_swapped_for_a_link_between_runs_is_left_out_and_said(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    fill(outside / "big", 8 << 20)
    job = tmp_path / "job"
    (job / "a" / "b").mkdir(parents=True)
    for i in range(600):
        (job / "a" / "b" / f"e{i}").touch()
    walk = jobfs.UsageWalk(jobfs.Tree(tmp_path), "job")
    assert not walk.run(max_entries=300)  # cut inside a/b
    os.rename(job / "a", job / "moved")
    (job / "a").symlink_to(outside)  # and a link to 8 MiB elsewhere in its place
    while not walk.run(max_entries=300):
        pass
    assert not walk.whole and walk.total < 1 << 20  # what is behind the link is not counted
    used, complete = jobfs.Tree(tmp_path).disk_usage("job")
    assert complete and used == du(job)  # a fresh walk of the tree as it is now


def test_memory_is_bounded_by_walking_waiting_subdirectories_first_and_counting_links_again(tmp_path, monkeypatch):
    monkeypatch.setattr(usage, "USAGE_PENDING", 8)
    monkeypatch.setattr(usage, "USAGE_LINKS", 4)
    job = tmp_path / "job"
    for i in range(60):
        (job / f"d{i}" / "inner").mkdir(parents=True)
        fill(job / f"d{i}" / "inner" / "f", 8192)
        (job / f"file{i}").touch()
    used, complete = jobfs.Tree(tmp_path).disk_usage("job")
    assert complete and used == du(job)  # every one of the 120 subdirectories, with 8 names at most waiting
    for i in range(10):  # ten files of two names each
        fill(job / f"d{i}" / "ck", 1 << 16)
        os.link(job / f"d{i}" / "ck", job / f"d{i}" / "inner" / "ck-again")
    used, complete = jobfs.Tree(tmp_path).disk_usage("job")
    assert complete and used > du(job)  # past 4 remembered, a name of it is counted again: never less


@pytest.mark.parametrize("path", ["missing", "file"])
def test_a_missing_top_or_one_that_is_not_a_directory_is_finished_not_whole(tmp_path, path):
    (tmp_path / "file").write_text("x")
    walk = jobfs.UsageWalk(jobfs.Tree(tmp_path), path)
    assert walk.run() and not walk.whole and walk.total == 0


def test_apparent_bytes_are_du_sbx_and_split_by_top_level_directory(tmp_path):
    top = tmp_path / "job"
    (top / "checkpoints" / "step-1").mkdir(parents=True)
    (top / "logs" / "deep" / "er").mkdir(parents=True)
    (top / "metrics").mkdir()
    (top / "checkpoints" / "step-1" / "w.pt").write_bytes(os.urandom(123_457))
    os.link(top / "checkpoints" / "step-1" / "w.pt", top / "metrics" / "again.pt")  # once
    (top / "logs" / "deep" / "er" / "rank-0.log").write_bytes(b"x" * 999)
    (top / "logs" / "out").symlink_to("/etc/passwd")  # the link's own size, never its target's
    (top / "sparse").write_bytes(b"")
    os.truncate(top / "sparse", 10 << 20)  # apparent 10 MiB, allocated nearly nothing
    (top / "script.sh").write_text("#!/bin/sh\n")
    walk = jobfs.UsageWalk(jobfs.Tree(tmp_path), "job")
    assert walk.run() and walk.whole
    sbx = int(subprocess.run(["du", "-s", "-b", "-x", str(top)], capture_output=True, text=True,
                             check=True).stdout.split()[0])
    assert walk.apparent == sbx
    assert sum(walk.by_top.values()) == walk.apparent
    assert set(walk.by_top) == {"", "checkpoints", "logs", "metrics"}
    assert walk.by_top[""] == os.lstat(top).st_size + (10 << 20) + len("#!/bin/sh\n")
    assert walk.by_top["logs"] == int(subprocess.run(["du", "-s", "-b", str(top / "logs")], capture_output=True,
                                                     text=True, check=True).stdout.split()[0])
