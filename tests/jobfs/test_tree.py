"""`trainyard.jobfs` on a real file system: what a job's owner can leave where the plane reads or
writes — a link on the way or at the end, a FIFO, a socket, a hard link, a gigabyte, a link swapped
in for a directory — is refused, bounded or never followed; work as the owner is done by the owner.
The attacks through a real plane are in tests/security/."""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from pathlib import Path

import pytest

from trainyard import jobfs


@pytest.fixture
def job(tmp_path: Path) -> jobfs.Tree:
    root = tmp_path / "job"
    (root / "metrics").mkdir(parents=True)
    (root / "logs").mkdir()
    return jobfs.Tree(root)


def test_a_link_at_the_end_or_on_the_way_is_refused(job, tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "metrics.jsonl").write_text("root's own\n")
    (job.root / "metrics" / "metrics.jsonl").symlink_to(secret / "metrics.jsonl")
    with pytest.raises(jobfs.Refused, match="symbolic link"):
        job.read_tail(job.root / "metrics" / "metrics.jsonl")
    (job.root / "metrics" / "metrics.jsonl").unlink()
    os.rmdir(job.root / "metrics")
    (job.root / "metrics").symlink_to(secret)  # the directory swapped for a link
    with pytest.raises(jobfs.Refused, match="metrics is a symbolic link"):
        job.read_tail("metrics/metrics.jsonl")
    assert job.tail_lines("metrics/metrics.jsonl") == [] and job.read_json("metrics/metrics.jsonl") is None
    with pytest.raises(jobfs.Refused):
        job.open_append("metrics/other.log")
    assert not (secret / "other.log").exists()


def test_a_fifo_a_socket_and_a_device_are_refused_at_once(job, tmp_path):
    os.mkfifo(job.root / "metrics" / "metrics.jsonl")
    t = time.monotonic()
    with pytest.raises(jobfs.Refused, match="a FIFO"):
        job.read_tail("metrics/metrics.jsonl")
    with pytest.raises(jobfs.Refused, match="a FIFO"):
        job.open_append("metrics/metrics.jsonl", create=False)
    assert time.monotonic() - t < 1.0  # nobody writes or reads the FIFO: a plain open would wait for ever
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(job.root / "logs" / "rank-0.log"))
    with pytest.raises(jobfs.Refused, match="a socket"):
        job.read_range("logs/rank-0.log", 0, 10)
    sock.close()
    (job.root / "logs" / "rank-1.log").symlink_to("/dev/zero")
    with pytest.raises(jobfs.Refused, match="symbolic link"):
        job.read_range("logs/rank-1.log", 0, 10)
    if os.geteuid() == 0:
        os.mknod(job.root / "logs" / "rank-2.log", 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
        with pytest.raises(jobfs.Refused, match="character device"):
            job.read_range("logs/rank-2.log", 0, 10)


def test_reads_are_bounded_whatever_the_size(job):
    big = job.root / "logs" / "rank-0.log"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # a sparse gigabyte
        f.seek((1 << 30) - 6)
        f.write(b"\nlast\n")
    page = job.read_range(big, 0, 1 << 40)
    assert len(page.data) == jobfs.PAGE_MAX and page.size == (1 << 30) and page.end == jobfs.PAGE_MAX
    assert job.read_range(big, -5, 100).data == b"last\n" and job.read_tail(big, 5) == b"last\n"
    assert job.read_range(big, 1 << 31, 10).data == b""  # past the end: nothing, no error
    assert job.tail_lines(big, 64) == [b"last"]
    assert job.read_json(big) is None and job.read_text(big) is None  # too big to be a record


def test_json_nested_past_the_recursion_limit_is_not_json(job):
    deep = job.root / "metrics" / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)  # 200 KB: within the bound, far past Python's recursion limit
    assert job.read_json(deep, limit=1 << 20) is None


def test_a_file_with_a_second_name_is_not_read(job, tmp_path):
    theirs = job.root / "metrics" / "theirs"
    theirs.write_text("someone's file\n")
    os.link(theirs, job.root / "metrics" / "metrics.jsonl")
    with pytest.raises(jobfs.Refused, match="2 names"):
        job.read_tail("metrics/metrics.jsonl")


def test_paths_outside_the_root_or_with_dotdot_are_refused(job, tmp_path):
    with pytest.raises(jobfs.Refused, match="not under"):
        job.read_tail(tmp_path / "elsewhere")
    with pytest.raises(jobfs.Refused, match=r"'\.\.'"):
        job.read_tail("logs/../../x")


def test_sample_lines_reads_windows_over_the_whole_of_a_big_file(job):
    path = job.root / "metrics" / "metrics.jsonl"
    with open(path, "w") as f:
        for step in range(200_000):
            f.write(json.dumps({"step": step, "loss": 1.0 / (step + 1)}) + "\n")
    size = path.stat().st_size
    lines = list(job.sample_lines(path, budget=64 << 10, windows=16))
    steps = [json.loads(x)["step"] for x in lines]
    assert sum(map(len, lines)) <= 64 << 10 and size > 1 << 20
    assert steps[0] == 0 and steps[-1] == 199_999 and steps == sorted(steps)
    assert all(isinstance(json.loads(x), dict) for x in lines)  # whole lines only
    assert len({s // 20_000 for s in steps}) == 10  # every tenth of the run is drawn
    small = list(job.sample_lines(path, budget=size))
    assert len(small) == 200_000


def test_writes_never_go_through_a_link(job, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (job.root / "metrics" / "record.json").symlink_to(outside / "record.json")
    job.write_json("metrics/record.json", {"a": 1})  # replaces the link, never writes through it
    assert not (outside / "record.json").exists() and json.loads((job.root / "metrics" / "record.json").read_text())
    (job.root / "run").symlink_to(outside)
    with pytest.raises(jobfs.Refused):
        job.make_dir("run/attempt-1")
    with pytest.raises(jobfs.Refused):
        job.create_file("run/x")
    assert list(outside.iterdir()) == []


def test_remove_tree_unlinks_links_and_never_follows_them(job, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    (job.root / "metrics" / "deep" / "er").mkdir(parents=True)
    (job.root / "metrics" / "deep" / "er" / "out").symlink_to(outside)
    os.mkfifo(job.root / "metrics" / "fifo")
    assert job.remove_tree("metrics") and not (job.root / "metrics").exists()
    assert (outside / "keep").read_text() == "keep"


def test_disk_usage_counts_hard_links_once_skips_links_and_stops_at_a_deadline(job, tmp_path):
    (tmp_path / "big").write_bytes(b"x" * (4 << 20))
    (job.root / "metrics" / "link").symlink_to(tmp_path / "big")  # a link to a big file elsewhere: not counted
    (job.root / "metrics" / "a").write_bytes(b"y" * (1 << 20))
    os.link(job.root / "metrics" / "a", job.root / "metrics" / "b")
    used, complete = job.disk_usage()
    assert complete and (1 << 20) <= used < (2 << 20)
    for i in range(3000):
        (job.root / "logs" / f"f{i}").touch()
    used, complete = job.disk_usage(deadline=time.monotonic() - 1)
    assert not complete
