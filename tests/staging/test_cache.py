"""The node's dataset cache (staging/cache.py): copied once, verified, atomic, read-only, evicted
least recently used over its cap unless pinned, and cleaned after a crash."""

from __future__ import annotations

import os
import stat
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from trainyard.staging.cache import NodeDatasetCache
from trainyard.staging.types import CHECKSUM_MISMATCH, DISK_FULL, NOT_FOUND, DataStagingError, SourceAccess

from tests.staging.local_source import Copier, digest, ref_of

ACCESS = SourceAccess()


def _cache(tmp_path: Path, cap: int | None = None) -> tuple[NodeDatasetCache, Copier]:
    copier = Copier()
    return NodeDatasetCache(tmp_path / "cache", cap, "n1", fetch=copier, digest=digest), copier


def _file(tmp_path: Path, name: str, size: int) -> Path:
    p = tmp_path / "src" / name
    p.parent.mkdir(exist_ok=True)
    p.write_bytes(os.urandom(size))
    return p


def test_a_file_is_copied_once_then_found(tmp_path):
    cache, copier = _cache(tmp_path)
    src = _file(tmp_path, "corpus.jsonl", 1000)
    first = cache.stage(ref_of(src), ACCESS)
    again = cache.stage(ref_of(src), ACCESS)
    assert first.copied and not again.copied and copier.copies == [str(src)]
    assert Path(first.path).read_bytes() == src.read_bytes() and again.path == first.path
    assert first.bytes == 1000
    [entry] = cache.entries()
    assert (entry.name, entry.version, entry.checksum, entry.bytes, entry.in_use) == \
        ("corpus", "v1", ref_of(src).checksum, 1000, False)


def test_a_directory_is_read_only_to_everyone(tmp_path):
    cache, _ = _cache(tmp_path)
    src = tmp_path / "src" / "shards"
    (src / "a").mkdir(parents=True)
    (src / "a" / "x.bin").write_bytes(b"x" * 10)
    (src / "y.bin").write_bytes(b"y" * 5)
    got = cache.stage(ref_of(src), ACCESS)
    root = Path(got.path)
    assert (root / "a" / "x.bin").read_bytes() == b"x" * 10 and got.bytes == 15
    for p in [root, root / "a", root.parent]:
        assert stat.S_IMODE(os.lstat(p).st_mode) == 0o555
    for p in [root / "a" / "x.bin", root / "y.bin"]:
        assert stat.S_IMODE(os.lstat(p).st_mode) == 0o444
    assert stat.S_IMODE(os.lstat(cache.root).st_mode) == 0o711


def test_a_mismatch_keeps_nothing(tmp_path):
    cache, _ = _cache(tmp_path)
    src = _file(tmp_path, "corpus.jsonl", 100)
    ref = ref_of(src)
    src.write_bytes(b"changed since it was added")
    with pytest.raises(DataStagingError) as e:
        cache.stage(ref, ACCESS, job=(1, 1))
    assert e.value.kind == CHECKSUM_MISMATCH and "corpus:v1" in str(e.value)
    assert cache.entries() == [] and not cache.has(ref.checksum)
    assert [n for n in os.listdir(cache.root) if n not in ("key", "lock", "locks", "pins")] == []
    assert os.listdir(cache.root / "pins" / cache.entry_of(ref.checksum)) == []  # the failed attempt's pin is gone


def test_a_missing_source_is_the_fetchs_error(tmp_path):
    cache, _ = _cache(tmp_path)
    src = _file(tmp_path, "c", 10)
    ref = replace(ref_of(src), source=str(tmp_path / "nowhere"))
    with pytest.raises(DataStagingError) as e:
        cache.stage(ref, ACCESS)
    assert e.value.kind == NOT_FOUND and cache.usage() == 0


def test_a_crash_mid_copy_leaves_nothing_visible_and_is_swept(tmp_path):
    cache, copier = _cache(tmp_path)
    src = _file(tmp_path, "corpus.jsonl", 100)
    ref = ref_of(src)

    class Killed(BaseException):
        pass

    def crash():
        raise Killed

    copier.before_return = crash
    # a real crash leaves the temporary directory: emulate it by keeping what the copy wrote
    real_remove = __import__("trainyard.staging.cache", fromlist=["_remove_tree"])._remove_tree
    import trainyard.staging.cache as mod
    mod._remove_tree = lambda p: None
    try:
        with pytest.raises(Killed):
            cache.stage(ref, ACCESS)
    finally:
        mod._remove_tree = real_remove
    left = [n for n in os.listdir(cache.root) if n.startswith(".tmp.")]
    assert len(left) == 1 and not cache.has(ref.checksum) and cache.entries() == []
    copier.before_return = None
    got = cache.stage(ref, ACCESS)
    assert got.copied and Path(got.path).read_bytes() == src.read_bytes()
    assert [n for n in os.listdir(cache.root) if n.startswith(".")] == []


def test_concurrent_stagings_of_one_entry_copy_once(tmp_path):
    cache, copier = _cache(tmp_path)
    src = _file(tmp_path, "corpus.jsonl", 200_000)
    other = NodeDatasetCache(tmp_path / "cache", None, "n1", fetch=copier, digest=digest)  # another thread's view
    results = []
    threads = [threading.Thread(target=lambda c=c: results.append(c.stage(ref_of(src), ACCESS)))
               for c in (cache, other, cache, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(copier.copies) == 1 and sum(r.copied for r in results) == 1 and len(results) == 4


def test_least_recently_used_unpinned_entries_make_room(tmp_path):
    cache, _ = _cache(tmp_path, cap=250)
    a, b, c = (_file(tmp_path, n, 100) for n in "abc")
    cache.stage(ref_of(a, "a"), ACCESS, job=(7, 1))  # pinned: a running attempt uses it
    cache.stage(ref_of(b, "b"), ACCESS)
    os.utime(cache.path_of(ref_of(a).checksum).parent / "meta.json", (1, 1))  # a is the oldest, but pinned
    cache.stage(ref_of(c, "c"), ACCESS)
    assert sorted(e.name for e in cache.entries()) == ["a", "c"]
    assert {e.name: e.in_use for e in cache.entries()} == {"a": True, "c": False}
    d = _file(tmp_path, "d", 200)
    with pytest.raises(DataStagingError) as e:  # c can go, a cannot: 100 + 200 > 250
        cache.stage(ref_of(d, "d"), ACCESS)
    assert e.value.kind == DISK_FULL
    cache.unpin(7, 1)
    assert cache.stage(ref_of(d, "d"), ACCESS).copied
    assert [e.name for e in cache.entries()] == ["d"] and cache.usage() == 200


def test_more_than_the_cap_is_disk_full_at_once(tmp_path):
    cache, copier = _cache(tmp_path, cap=50)
    with pytest.raises(DataStagingError) as e:
        cache.stage(ref_of(_file(tmp_path, "big", 100)), ACCESS)
    assert e.value.kind == DISK_FULL and copier.copies == []


def test_remove_refuses_a_pinned_entry(tmp_path):
    cache, _ = _cache(tmp_path)
    ref = ref_of(_file(tmp_path, "a", 10))
    cache.stage(ref, ACCESS, job=(3, 2))
    assert not cache.remove(ref.checksum)
    cache.unpin(3, 2)
    assert cache.remove(ref.checksum) and not cache.has(ref.checksum) and not cache.remove(ref.checksum)


def test_a_link_in_the_caches_place_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cache").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(DataStagingError):
        NodeDatasetCache(tmp_path / "cache", None, "n1", fetch=Copier(), digest=digest)


def test_knowing_a_checksum_is_not_knowing_where_its_copy_lies(tmp_path):
    # Another team's job on the node may know or guess a dataset's checksum; the root lists
    # nothing (0711) and the entry's name is keyed by the cache's own secret, so it cannot reach it.
    cache, _ = _cache(tmp_path)
    src = _file(tmp_path, "corpus.jsonl", 100)
    got = cache.stage(ref_of(src), ACCESS)
    hexa = ref_of(src).checksum[7:]
    assert not (cache.root / hexa).exists() and hexa not in got.path
    key = os.lstat(cache.root / "key")
    assert stat.S_ISREG(key.st_mode) and stat.S_IMODE(key.st_mode) == 0o600 and key.st_size == 32
    assert stat.S_IMODE(os.lstat(cache.root).st_mode) == 0o711
    other = NodeDatasetCache(tmp_path / "other", None, "n2", fetch=Copier(), digest=digest)
    assert other.entry_of(ref_of(src).checksum) != cache.entry_of(ref_of(src).checksum)  # a key per cache
    again = NodeDatasetCache(cache.root, None, "n1", fetch=Copier(), digest=digest)  # the plane restarted
    assert again.has(ref_of(src).checksum) and str(again.path_of(ref_of(src).checksum)) == got.path


@pytest.mark.parametrize("plant", ["link", "fifo", "short", "open"])
def test_a_key_that_is_not_the_caches_own_secret_is_refused(tmp_path, plant):
    root = tmp_path / "cache"
    root.mkdir(mode=0o711)
    if plant == "link":  # a link to a file whose bytes somebody else knows
        (tmp_path / "known").write_bytes(b"k" * 32)
        (root / "key").symlink_to(tmp_path / "known")
    elif plant == "fifo":  # would hang a plain open()
        os.mkfifo(root / "key", 0o600)
    elif plant == "short":
        (root / "key").write_bytes(b"k")
        os.chmod(root / "key", 0o600)
    else:  # readable by others
        (root / "key").write_bytes(b"k" * 32)
        os.chmod(root / "key", 0o644)
    with pytest.raises(DataStagingError, match="key"):
        NodeDatasetCache(root, None, "n1", fetch=Copier(), digest=digest)


def test_a_dataset_of_unknown_size_still_brings_the_cache_under_its_cap(tmp_path):
    cache, _ = _cache(tmp_path, cap=250)
    a, b = _file(tmp_path, "a", 100), _file(tmp_path, "b", 200)
    cache.stage(ref_of(a, "a"), ACCESS)
    got = cache.stage(replace(ref_of(b, "b"), bytes=0), ACCESS)  # its size unknown until copied
    assert got.bytes == 200 and [e.name for e in cache.entries()] == ["b"] and cache.usage() == 200
