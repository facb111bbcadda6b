"""`images/layers.py` on layers built here, hostile ones first: nothing escapes the layer's
directory, the host is untouched, whiteouts take overlayfs's form, owners and modes are kept."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from trainyard.images.layers import unpack
from trainyard.images.types import BAD_IMAGE, DISK_FULL, ImagePullError

GZ = "application/vnd.oci.image.layer.v1.tar+gzip"


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", *, link: str = "", mode: int = 0o644,
           uid: int = 0, gid: int = 0, dev: tuple[int, int] = (0, 0)) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.uid, info.gid, info.linkname = kind, mode, uid, gid, link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.devmajor, info.devminor = dev
    info.mtime = 1_700_000_000
    return info, data


def layer(*members: tuple[tarfile.TarInfo, bytes], gz: bool = True) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    raw = buf.getvalue()
    return gzip.compress(raw) if gz else raw


def run_unpack(tmp_path: Path, blob: bytes, *, diff_id: str | None = None, budget: int = 1 << 40,
               media_type: str = GZ) -> Path:
    dest = tmp_path / "layer"
    dest.mkdir()
    unpack(io.BytesIO(blob), str(dest), image="test/img@sha256:x", media_type=media_type, diff_id=diff_id,
           budget=budget)
    return dest


def refused(tmp_path: Path, blob: bytes, fragment: str) -> None:
    with pytest.raises(ImagePullError) as e:
        run_unpack(tmp_path, blob)
    assert e.value.kind == BAD_IMAGE and fragment in str(e.value), str(e.value)


def test_files_dirs_links_owners_and_modes_are_kept(tmp_path):
    blob = layer(member("usr/", tarfile.DIRTYPE, mode=0o755),
                 member("usr/bin/", tarfile.DIRTYPE, mode=0o755),
                 member("usr/bin/tool", data=b"#!/bin/sh\n", mode=0o4755),
                 member("home/bob/notes", data=b"bob's", mode=0o600, uid=1234, gid=2345),
                 member("usr/bin/alias", tarfile.SYMTYPE, link="/usr/bin/tool"),
                 member("usr/bin/hard", tarfile.LNKTYPE, link="usr/bin/tool"),
                 member("dev/sda", tarfile.BLKTYPE, dev=(8, 0)),
                 member("dev/null", tarfile.CHRTYPE, dev=(1, 3)),
                 member("run/fifo", tarfile.FIFOTYPE, mode=0o600))
    raw = gzip.decompress(blob)
    dest = run_unpack(tmp_path, blob, diff_id="sha256:" + hashlib.sha256(raw).hexdigest())
    tool = os.lstat(dest / "usr/bin/tool")
    assert stat.S_IMODE(tool.st_mode) == 0o4755 and (tool.st_uid, tool.st_gid) == (0, 0)  # set-uid kept after chown
    notes = os.lstat(dest / "home/bob/notes")
    assert (notes.st_uid, notes.st_gid, stat.S_IMODE(notes.st_mode)) == (1234, 2345, 0o600)
    assert os.readlink(dest / "usr/bin/alias") == "/usr/bin/tool"  # made, never followed
    assert os.lstat(dest / "usr/bin/hard").st_ino == tool.st_ino
    assert not (dest / "dev/sda").exists() and not (dest / "dev/null").exists()  # devices: skipped
    assert stat.S_ISFIFO(os.lstat(dest / "run/fifo").st_mode)
    assert int(os.lstat(dest / "usr").st_mtime) == 1_700_000_000


def test_whiteouts_become_overlay_whiteouts(tmp_path):
    dest = run_unpack(tmp_path, layer(member("etc/.wh.gone"), member("opt/.wh..wh..opq"),
                                      member("opt/new", data=b"n")))
    gone = os.lstat(dest / "etc/gone")
    assert stat.S_ISCHR(gone.st_mode) and gone.st_rdev == os.makedev(0, 0)
    assert not (dest / "etc/.wh.gone").exists()
    assert os.getxattr(dest / "opt", "trusted.overlay.opaque") == b"y"
    assert not (dest / "opt/.wh..wh..opq").exists() and (dest / "opt/new").read_bytes() == b"n"


def test_an_uncompressed_layer_unpacks(tmp_path):
    dest = run_unpack(tmp_path, layer(member("a", data=b"x"), gz=False),
                      media_type="application/vnd.oci.image.layer.v1.tar")
    assert (dest / "a").read_bytes() == b"x"


@pytest.mark.parametrize(("name", "fragment"), [
    ("/etc/passwd", "absolute path"),
    ("../../escaped", "climbs out"),
    ("a/../../escaped", "climbs out"),
])
def test_paths_that_escape_are_refused(tmp_path, name, fragment):
    refused(tmp_path, layer(member(name, data=b"pwned")), fragment)
    assert not (tmp_path / "escaped").exists() and not (tmp_path.parent / "escaped").exists()


def test_a_link_of_the_layer_is_never_written_through(tmp_path):
    """`etc -> <host dir>` then `etc/passwd`: refused, and nothing lands in the host directory
    (an absolute link, and a relative one climbing out)."""
    host = tmp_path / "host-etc"
    host.mkdir()
    for target in (str(host), "../host-etc"):
        work = tmp_path / f"try-{len(target)}"
        work.mkdir()
        refused(work, layer(member("etc", tarfile.SYMTYPE, link=target),
                            member("etc/passwd", data=b"root::0:0::/:/bin/sh\n")), "goes through a link")
    assert list(host.iterdir()) == []


def test_a_directory_through_a_link_is_refused(tmp_path):
    host = tmp_path / "host"
    host.mkdir()
    refused(tmp_path, layer(member("d", tarfile.SYMTYPE, link=str(host)), member("d/sub/", tarfile.DIRTYPE)),
            "goes through a link")
    assert list(host.iterdir()) == []


def test_a_file_over_a_link_replaces_the_link_not_its_target(tmp_path):
    """A regular file named like an earlier link replaces the link (as tar does); the link's
    target is untouched."""
    host = tmp_path / "host-file"
    host.write_text("host's")
    dest = run_unpack(tmp_path, layer(member("f", tarfile.SYMTYPE, link=str(host)), member("f", data=b"image's")))
    assert host.read_text() == "host's" and (dest / "f").read_bytes() == b"image's"
    assert not (dest / "f").is_symlink()


def test_hard_links_only_to_earlier_members_of_the_layer(tmp_path):
    secret = tmp_path / "host-secret"
    secret.write_text("s")
    refused(tmp_path, layer(member("h", tarfile.LNKTYPE, link=str(secret).lstrip("/"))), "not an earlier file")
    work = tmp_path / "w2"
    work.mkdir()
    refused(work, layer(member("h", tarfile.LNKTYPE, link="later"), member("later", data=b"x")), "not an earlier file")
    work = tmp_path / "w3"
    work.mkdir()
    refused(work, layer(member("h", tarfile.LNKTYPE, link="../../etc/passwd")), "climbs out")
    assert os.stat(secret).st_nlink == 1


def test_zstd_is_refused_with_its_own_message(tmp_path):
    refused(tmp_path, b"\x28\xb5\x2f\xfd" + b"\0" * 64, "zstd layers not supported")


def test_garbage_and_a_wrong_diff_id_are_bad_images(tmp_path):
    refused(tmp_path, gzip.compress(b"not a tar at all" * 100), "not a valid tar")
    work = tmp_path / "w"
    work.mkdir()
    with pytest.raises(ImagePullError) as e:
        run_unpack(work, layer(member("a", data=b"x")), diff_id="sha256:" + "0" * 64)
    assert e.value.kind == BAD_IMAGE and "diff_id" in str(e.value)


def test_a_bomb_stops_at_the_budget(tmp_path):
    """A layer that inflates past its budget (here 10 MB of zeros, 10 KB compressed) is DISK_FULL."""
    with pytest.raises(ImagePullError) as e:
        run_unpack(tmp_path, layer(member("zeros", data=b"\0" * 10_000_000)), budget=1_000_000)
    assert e.value.kind == DISK_FULL


def test_bad_whiteouts_are_refused(tmp_path):
    refused(tmp_path, layer(member("d/.wh.", data=b"")), "bad whiteout")
    work = tmp_path / "w"
    work.mkdir()
    refused(work, layer(member("d/.wh.x", tarfile.CHRTYPE, dev=(1, 3))), "not a plain entry")
