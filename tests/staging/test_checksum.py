"""A dataset's checksum (`staging/checksum.py`): the definition of `staging/types.py`, the same for
a path, its copy and the same files in an object store."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.staging.seaweed import SeaweedS3, seaweed  # noqa: F401  (fixture)
from trainyard.staging import checksum as C
from trainyard.staging import source as S
from trainyard.staging.types import CHECKSUM_RE, FORBIDDEN, NOT_FOUND, DataStagingError, SourceAccess

NONE = SourceAccess(timeout_s=10)
FILES = {"a.txt": b"alpha\n", "a/b": b"beta", "a/c/d.bin": bytes(range(256)) * 5000, "z": b""}


def _expected(files: dict[str, bytes]) -> str:
    """The definition, written out: one line per file, sorted by path as bytes."""
    lines = b"".join(p.encode() + b"\0" + str(len(d)).encode() + b"\0" + hashlib.sha256(d).hexdigest().encode() + b"\n"
                     for p, d in sorted(files.items(), key=lambda x: x[0].encode()))
    return "sha256:" + hashlib.sha256(lines).hexdigest()


def _write(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_a_file_is_the_sha256_of_its_bytes(tmp_path: Path):
    f = tmp_path / "f"
    f.write_bytes(b"hello")
    want = "sha256:" + hashlib.sha256(b"hello").hexdigest()
    assert C.of_local(f) == want == C.of_source(str(f), NONE, None)
    assert CHECKSUM_RE.match(want) and C.is_checksum(want) and not C.is_checksum("sha256:XYZ")


def test_a_directory_follows_the_definition_and_ignores_empty_directories(tmp_path: Path):
    root = _write(tmp_path / "d", FILES)
    (root / "empty" / "dirs").mkdir(parents=True)
    want = _expected(FILES)
    assert C.of_local(root) == want
    summary = C.summary_of_source(str(root), NONE, None)
    assert summary == {"checksum": want, "kind": "dir", "bytes": sum(map(len, FILES.values())), "files": 4}
    S.fetch(str(root), NONE, None, str(tmp_path / "copy"))
    assert C.of_local(tmp_path / "copy") == want


def test_a_changed_byte_or_name_changes_it(tmp_path: Path):
    root = _write(tmp_path / "d", FILES)
    before = C.of_local(root)
    (root / "a" / "b").write_bytes(b"betA")
    assert C.of_local(root) != before
    (root / "a" / "b").write_bytes(b"beta")
    assert C.of_local(root) == before
    (root / "a" / "b").rename(root / "a" / "B")
    assert C.of_local(root) != before


def test_links_are_refused_and_missing_is_not_found(tmp_path: Path):
    root = _write(tmp_path / "d", FILES)
    (root / "link").symlink_to(root / "a.txt")
    with pytest.raises(DataStagingError) as e:
        C.of_local(root)
    assert e.value.kind == FORBIDDEN
    with pytest.raises(DataStagingError) as e:
        C.of_source(str(root), NONE, None)
    assert e.value.kind == FORBIDDEN
    with pytest.raises(DataStagingError) as e:
        C.of_source(str(tmp_path / "nope"), NONE, None)
    assert e.value.kind == NOT_FOUND


def test_an_object_store_prefix_hashes_as_the_same_files_on_disk(seaweed: SeaweedS3, tmp_path: Path):  # noqa: F811
    for rel, data in FILES.items():
        seaweed.put(f"sums/{rel}", data)
    access = SourceAccess(stores=(seaweed.object_store(),), timeout_s=10)
    url = seaweed.url("sums")
    assert C.of_source(url, access, None) == _expected(FILES)
    assert C.of_source(seaweed.url("sums/a/b"), access, None) == "sha256:" + hashlib.sha256(b"beta").hexdigest()
    S.fetch(url, access, None, str(tmp_path / "copy"))
    assert C.of_local(tmp_path / "copy") == _expected(FILES)


def test_memory_does_not_grow_with_a_file(tmp_path: Path):
    import subprocess
    import sys

    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # 1 GiB, sparse
    code = ("import resource, sys; from trainyard.staging.checksum import of_local; "
            "rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; before = rss(); "
            "of_local(sys.argv[1]); print(rss() - before)")
    out = subprocess.run([sys.executable, "-c", code, str(big)], capture_output=True, text=True, check=True,
                         env={**os.environ})
    assert int(out.stdout) < 32 << 10, f"{out.stdout} KiB more"  # far below the file's 1 GiB
