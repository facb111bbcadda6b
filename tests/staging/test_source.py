"""Reading a dataset's source (`staging/source.py`): a path read as its reader through no link, an
s3:// URL against a real SeaweedFS, and each failure sorted into its kind."""

from __future__ import annotations

import http.server
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.accounts import ROOT_ONLY, accounts, shared_dir
from tests.mounts import tmpfs
from tests.staging.seaweed import OUTSIDER_KEY, OUTSIDER_SECRET, SeaweedS3, seaweed  # noqa: F401  (fixture)
from trainyard.staging import objects, source as S
from trainyard.staging.as_reader import Stalled, reading_as
from trainyard.staging.types import (DISK_FULL, FORBIDDEN, NOT_FOUND, UNREACHABLE, DataStagingError, ObjectStore,
                                     Reader, SourceAccess)

NONE = SourceAccess(timeout_s=10)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _corpus(root: Path) -> Path:
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "a.jsonl").write_bytes(b'{"x": 1}\n' * 1000)
    (root / "sub" / "b.bin").write_bytes(os.urandom(3 << 20))  # more than one chunk
    (root / "sub" / "deep" / "c").write_bytes(b"")
    return root


# -- paths ------------------------------------------------------------------------------------------


def test_a_file_and_a_directory_are_probed_and_copied_as_they_are(tmp_path: Path):
    src = _corpus(tmp_path / "src")
    info = S.probe(str(src), NONE, None)
    assert info == S.SourceInfo("dir", 9000 + (3 << 20), 3)
    S.fetch(str(src), NONE, None, str(tmp_path / "copy"))
    assert _tree(tmp_path / "copy") == _tree(src)
    assert (tmp_path / "copy" / "empty").is_dir()
    one = src / "a.jsonl"
    assert S.probe(str(one), NONE, None) == S.SourceInfo("file", 9000, 1)
    S.fetch(str(one), NONE, None, str(tmp_path / "one"))
    assert (tmp_path / "one").read_bytes() == one.read_bytes()


def test_the_copy_goes_only_to_a_new_place(tmp_path: Path):
    (tmp_path / "f").write_bytes(b"x")
    (tmp_path / "taken").write_bytes(b"mine")
    with pytest.raises(FileExistsError):
        S.fetch(str(tmp_path / "f"), NONE, None, str(tmp_path / "taken"))
    assert (tmp_path / "taken").read_bytes() == b"mine"


@pytest.mark.parametrize("where", ["inside", "itself"])
def test_a_link_is_refused_and_nothing_is_left(tmp_path: Path, where: str):
    src = _corpus(tmp_path / "src")
    secret = tmp_path / "secret"
    secret.write_bytes(b"not yours")
    if where == "inside":
        (src / "sub" / "zz-link").symlink_to(secret)
        path = src
    else:
        path = tmp_path / "link"
        path.symlink_to(src)
    for call in (lambda: S.probe(str(path), NONE, None), lambda: S.fetch(str(path), NONE, None, str(tmp_path / "copy"))):
        with pytest.raises(DataStagingError) as e:
            call()
        assert e.value.kind == FORBIDDEN and "symbolic link" in str(e.value)
    assert not os.path.lexists(tmp_path / "copy")  # the files copied before the link were removed


def test_a_fifo_is_refused_at_once(tmp_path: Path):
    src = _corpus(tmp_path / "src")
    os.mkfifo(src / "pipe")
    t0 = time.monotonic()
    with pytest.raises(DataStagingError) as e:
        S.fetch(str(src), NONE, None, str(tmp_path / "copy"))
    assert e.value.kind == FORBIDDEN and "FIFO" in str(e.value) and time.monotonic() - t0 < 5
    assert not os.path.lexists(tmp_path / "copy")


def test_a_missing_path_is_not_found_and_a_relative_one_refused(tmp_path: Path):
    with pytest.raises(DataStagingError) as e:
        S.probe(str(tmp_path / "nope"), NONE, None, label="corpus:v1")
    assert e.value.kind == NOT_FOUND and str(e.value).startswith("corpus:v1: ")
    for bad in ("relative/path", "/", "/proc/kmsg", "/dev/../dev/zero", "/sys/kernel"):
        with pytest.raises(DataStagingError) as e:
            S.probe(bad, NONE, None)
        assert e.value.kind == FORBIDDEN, bad


def test_a_silent_reader_is_killed_after_the_time_limit():
    def hang(send):
        time.sleep(60)

    t0 = time.monotonic()
    with pytest.raises(Stalled), reading_as(None, hang, 0.5) as frames:
        for _ in frames:
            pass
    assert time.monotonic() - t0 < 10


def test_a_full_disk_is_disk_full_and_leaves_nothing(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"x" * (1 << 20))
    (src / "b").write_bytes(os.urandom(3 << 20))
    with tmpfs(tmp_path / "small", 2) as small:
        with pytest.raises(DataStagingError) as e:
            S.fetch(str(src), NONE, None, str(small / "copy"))
        assert e.value.kind == DISK_FULL and e.value.source_fault
        assert os.listdir(small) == []


@ROOT_ONLY
def test_a_path_is_read_as_its_reader_never_as_root():
    with accounts({"alice": [], "bob": []}, []) as acc, shared_dir("ty-src-") as d:
        alice = Reader(acc.uid("alice"), _gid(acc.user("alice")))
        bob_file = d / "bobs.bin"
        bob_file.write_bytes(b"bob only")
        os.chown(bob_file, acc.uid("bob"), _gid(acc.user("bob")))
        bob_file.chmod(0o600)
        mine = d / "alices"
        mine.mkdir()
        (mine / "x").write_bytes(b"alice's")
        os.chown(mine, acc.uid("alice"), -1)
        os.chown(mine / "x", acc.uid("alice"), -1)
        mine.chmod(0o700)
        (mine / "x").chmod(0o600)
        with pytest.raises(DataStagingError) as e:
            S.probe(str(bob_file), NONE, alice)
        assert e.value.kind == FORBIDDEN
        out = d / "copy"
        with pytest.raises(DataStagingError):
            S.fetch(str(bob_file), NONE, alice, str(out))
        assert not out.exists()
        S.fetch(str(mine), NONE, alice, str(out))  # her own 0700 directory: hers to read
        assert (out / "x").read_bytes() == b"alice's"
        S.fetch(str(bob_file), NONE, None, str(d / "op"))  # no reader: the plane's (an operator's dataset)
        assert (d / "op").read_bytes() == b"bob only"


def _gid(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_gid


# -- object stores ----------------------------------------------------------------------------------


def _access(*stores: ObjectStore) -> SourceAccess:
    return SourceAccess(stores=stores, timeout_s=10)


def test_an_object_and_a_prefix_are_probed_and_copied(seaweed: SeaweedS3, tmp_path: Path):  # noqa: F811
    blob = os.urandom((9 << 20) + 5)  # more than one ranged read
    url = seaweed.put("corpus/v1/train.jsonl", blob)
    seaweed.put("corpus/v1/meta/info.json", b"{}")
    access = _access(seaweed.object_store())
    assert S.probe(url, access, None) == S.SourceInfo("file", len(blob), 1)
    S.fetch(url, access, None, str(tmp_path / "one"))
    assert (tmp_path / "one").read_bytes() == blob
    prefix = seaweed.url("corpus/v1")
    assert S.probe(prefix, access, None) == S.SourceInfo("dir", len(blob) + 2, 2)
    S.fetch(prefix + "/", access, None, str(tmp_path / "tree"))
    assert _tree(tmp_path / "tree") == {"train.jsonl": blob, "meta/info.json": b"{}"}


def test_the_longest_store_prefix_wins_and_no_store_is_forbidden(seaweed: SeaweedS3):  # noqa: F811
    url = seaweed.put("stores/x", b"x")
    refused = seaweed.object_store(seaweed.url("stores"), secret="wrong")
    good = seaweed.object_store()
    assert S.probe(url, _access(good), None).bytes == 1
    with pytest.raises(DataStagingError) as e:
        S.probe(url, _access(good, refused), None)  # the longer prefix's (refused) credentials
    assert e.value.kind == FORBIDDEN
    with pytest.raises(DataStagingError) as e:
        S.probe("s3://another-bucket/x", _access(good), None)
    assert e.value.kind == FORBIDDEN and "s3://another-bucket/x" in str(e.value)


def test_refused_credentials_are_forbidden_and_a_missing_key_not_found(seaweed: SeaweedS3, tmp_path: Path):  # noqa: F811
    url = seaweed.put("refused/x", b"x")
    for store in (seaweed.object_store(secret="wrong"),
                  seaweed.object_store(key=OUTSIDER_KEY, secret=OUTSIDER_SECRET)):
        with pytest.raises(DataStagingError) as e:
            S.fetch(url, _access(store), None, str(tmp_path / "c"))
        assert e.value.kind == FORBIDDEN, e.value
        assert not (tmp_path / "c").exists()
    with pytest.raises(DataStagingError) as e:
        S.probe(seaweed.url("refused/nothing-here"), _access(seaweed.object_store()), None)
    assert e.value.kind == NOT_FOUND


@pytest.mark.parametrize("rel", ["a/../../escape", "a//b", "./c", "../d", "e/.", ""])
def test_a_key_that_is_no_clean_path_below_the_prefix_is_refused(rel: str):
    # SeaweedFS itself normalises such keys; other stores keep them as they come
    assert not objects.clean_rel(rel)
    assert objects.clean_rel("a/b.c/d..e")


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Busy(http.server.BaseHTTPRequestHandler):
    def do_any(self) -> None:
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = do_PUT = do_POST = do_any

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def busy_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Busy)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_refused_connections_and_5xx_are_unreachable(busy_server: str, tmp_path: Path):
    for endpoint in (f"http://127.0.0.1:{_closed_port()}", busy_server):
        access = SourceAccess(stores=(ObjectStore("s3://data", endpoint_url=endpoint, key="k", secret="s"),), timeout_s=5)
        with pytest.raises(DataStagingError) as e:
            S.fetch("s3://data/x", access, None, str(tmp_path / "c"))
        assert e.value.kind == UNREACHABLE and e.value.source_fault, (endpoint, e.value)
        assert not (tmp_path / "c").exists()
