"""The checkpoint archive's I/O (staging/archive_io.py) against a real SeaweedFS S3 server and a
path: a step archived byte for byte and verified, the marker last, removed marker first; fetched
back into a job dir as a real account's files (useradd), every file checked; a corrupted archive
copy refused; a manifest that names a path outside its step refused; a fetch never writes through a link."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.accounts import ROOT_ONLY, accounts
from tests.staging.seaweed import seaweed  # noqa: F401 - the module's S3 server
from trainyard.jobfs import Tree
from trainyard.staging.archive_io import Archive, ArchiveError, Throttle, parse_manifest, read_manifest


def step_dir(root: Path, step: int, size: int = 1 << 20) -> dict[str, bytes]:
    d = root / "checkpoints" / f"step-{step}"
    d.mkdir(parents=True)
    files = {"__0_0.distcp": os.urandom(size), ".metadata": os.urandom(300), "rank-0.pt": os.urandom(70)}
    for k, v in files.items():
        (d / k).write_bytes(v)
    (d / "COMMITTED").write_text(json.dumps({"step": step, "files": {k: len(v) for k, v in files.items()},
                                             "metrics": {"loss": 1.5, "note": "x", "nan": float("nan")}}))
    return files


@pytest.fixture(params=["path", "s3"])
def archive(request, tmp_path):
    if request.param == "path":
        return Archive(str(tmp_path / "archive"))
    s3 = request.getfixturevalue("seaweed")
    return Archive(s3.url("ckpt"), s3.object_store())


@ROOT_ONLY
def test_a_step_goes_to_the_archive_verified_and_comes_back_as_the_owners(archive, tmp_path):
    src = tmp_path / "job"
    files = step_dir(src, 5)
    tree = Tree(src)
    m = read_manifest(tree, "checkpoints", 5)
    assert m.metrics == {"loss": 1.5} and m.bytes == sum(len(v) for v in files.values())
    where = archive.location(7, "abc", 5)
    held = archive.put_step(tree, "checkpoints", m, where, Throttle(0))  # what the archive holds for it: all it wrote
    assert held == sum(archive.fs.size(f) for f in archive.fs.find(archive._path(where))) > m.bytes
    assert archive.committed(where)
    dst = tmp_path / "again"
    (dst / "checkpoints").mkdir(parents=True)
    with accounts({"owner": ["team"]}, ["team"]) as acc:
        owner = (acc.uid("owner"), acc.gid("team"))
        assert archive.fetch_step(where, Tree(dst), "checkpoints", 5, owner) == m.bytes
        back = dst / "checkpoints" / "step-5"
        for k, v in files.items():
            assert hashlib.sha256((back / k).read_bytes()).digest() == hashlib.sha256(v).digest()
            st = (back / k).stat()
            assert (st.st_uid, st.st_gid) == owner
        assert (back / "COMMITTED").stat().st_uid == owner[0]
        assert json.loads((back / "COMMITTED").read_text())["step"] == 5
    archive.remove(where)
    assert not archive.committed(where)


def test_a_corrupted_archive_copy_is_refused_at_fetch(archive, tmp_path):
    src = tmp_path / "job"
    step_dir(src, 3, size=5000)
    tree = Tree(src)
    where = archive.location(8, None, 3)
    archive.put_step(tree, "checkpoints", read_manifest(tree, "checkpoints", 3), where, Throttle(0))
    base = where[len("s3://"):] if where.startswith("s3://") else where
    with archive.fs.open(f"{base}/rank-0.pt", "wb") as fh:  # the same size, other bytes
        fh.write(b"\0" * 70)
    dst = tmp_path / "again"
    (dst / "checkpoints").mkdir(parents=True)
    with pytest.raises(ArchiveError, match="rank-0.pt: sha256"):
        archive.fetch_step(where, Tree(dst), "checkpoints", 3, None)
    assert not (dst / "checkpoints" / "step-3" / "COMMITTED").exists()  # never a complete-looking step


@pytest.mark.parametrize("name", ["../../etc/passwd", "a/b", "COMMITTED.tmp", "", "SHA256SUMS"])
def test_a_manifest_naming_anything_but_a_plain_file_is_refused(name):
    with pytest.raises(ArchiveError, match="not a plain name"):
        parse_manifest(1, json.dumps({"files": {name: 3}}).encode())


def test_the_throttle_holds_a_copy_to_its_rate(tmp_path):
    src = tmp_path / "job"
    step_dir(src, 1, size=3 << 20)
    tree = Tree(src)
    m = read_manifest(tree, "checkpoints", 1)
    t = Throttle(8.0)  # 8 MB/s: 3 MiB take at least ~0.37 s
    Archive(str(tmp_path / "a")).put_step(tree, "checkpoints", m, str(tmp_path / "a" / "s1"), t)
    assert t.done == m.bytes


def test_a_fetch_never_writes_through_a_link_the_owner_planted(tmp_path):
    src = tmp_path / "job"
    step_dir(src, 4, size=1000)
    tree = Tree(src)
    archive = Archive(str(tmp_path / "archive"))
    where = archive.location(9, None, 4)
    archive.put_step(tree, "checkpoints", read_manifest(tree, "checkpoints", 4), where, Throttle(0))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dst = tmp_path / "again"
    dst.mkdir()
    (dst / "checkpoints").symlink_to(elsewhere)  # the job's checkpoints/ is a link
    with pytest.raises(OSError):
        archive.fetch_step(where, Tree(dst), "checkpoints", 4, None)
    assert list(elsewhere.iterdir()) == []
    (dst / "checkpoints").unlink()
    (dst / "checkpoints").mkdir()
    (dst / "checkpoints" / "step-4").symlink_to(elsewhere)  # the step itself is a link: replaced, not followed
    archive.fetch_step(where, Tree(dst), "checkpoints", 4, None)
    assert list(elsewhere.iterdir()) == [] and (dst / "checkpoints" / "step-4" / "COMMITTED").is_file()
    assert not (dst / "checkpoints" / "step-4").is_symlink()


def test_s3_clients_share_one_botocore_session_and_the_archive_keeps_its_client(seaweed, tmp_path):  # noqa: F811
    # A new botocore session parses its S3 models again (megabytes of JSON in one hold of the GIL):
    # done once per tiers round it starved a loaded plane's API for seconds (a 10 s GET timed out).
    from trainyard.staging import objects

    a, b = Archive(seaweed.url("ckpt"), seaweed.object_store()), Archive(seaweed.url("other"), seaweed.object_store())
    assert a.fs is not b.fs and a.fs.session is b.fs.session is objects.session()
    files = step_dir(tmp_path / "job", 3, size=1000)
    tree = Tree(tmp_path / "job")
    where = a.location(1, "k", 3)
    assert a.put_step(tree, "checkpoints", read_manifest(tree, "checkpoints", 3), where, Throttle(0)) > sum(
        len(v) for v in files.values())  # each client its own credentials: the shared session holds none
    assert a.committed(where) and not b.committed(b.location(1, "k", 3))
