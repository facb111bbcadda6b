"""`parse_mounts`: `--container-mounts` read as pyxis reads it, and what it refuses named."""

from __future__ import annotations

import pytest

from trainyard.spec.container_mounts import Mount, parse_mounts


@pytest.mark.parametrize("text,want", [
    ("/data:/data", (Mount("/data", "/data"),)),
    ("/data:/data:ro", (Mount("/data", "/data", True),)),
    ("/scratch", (Mount("/scratch", "/scratch"),)),  # pyxis: DST defaults to SRC
    ("/data/imagenet:/datasets/imagenet:ro+rprivate,/home/alice/code:/code:rw+nosuid+nodev",
     (Mount("/data/imagenet", "/datasets/imagenet", True, ("rprivate",)),
      Mount("/home/alice/code", "/code", False, ("nosuid", "nodev")))),
    ("/a:/x/:ro+ro", (Mount("/a", "/x", True),)),  # a trailing '/' and a repeated flag change nothing
    ("/a:/x,/a:/x", (Mount("/a", "/x"),)),  # the same entry twice counts once, as in pyxis
    ("/a:/x//y/./z", (Mount("/a", "/x/y/z"),)),
    ("/a:/b:", (Mount("/a", "/b"),)),  # empty FLAGS: none, as in pyxis
])
def test_mounts(text, want):
    assert parse_mounts(text) == want


def test_a_mount_writes_back_as_pyxis_reads_it():
    mounts = parse_mounts("/data:/datasets:ro+rslave,/code:/code")
    assert ",".join(m.pyxis() for m in mounts) == "/data:/datasets:ro+rslave,/code:/code"
    assert parse_mounts(",".join(m.pyxis() for m in mounts)) == mounts


@pytest.mark.parametrize("text,words", [
    ("", "expected SRC:DST[:FLAGS]"),
    ("/a:/", "target of '/a:/' is '/'"),
    ("/a://", "is '/'"),
    ("/a:/x/../y", "target '/x/../y' of '/a:/x/../y' has a '..' component"),
    ("/a:..", "an absolute path is needed"),
    ("data:/data", "source 'data' of 'data:/data': an absolute path is needed"),
    ("/data:data", "target 'data' of '/data:data': an absolute path is needed"),
    ("./data:/data", "an absolute path is needed"),
    ("tmpfs:/scratch", "'tmpfs' and 'umount' are not supported"),
    ("/a:/x:rox", "unknown flag 'rox' in '/a:/x:rox'"),
    ("/a:/x:ro,rprivate", "flags are joined by '+'"),  # flags are joined by '+', not ','
    ("/a:/x:ro+rw", "both 'ro' and 'rw'"),
    ("/a:/x:private+rshared", "more than one propagation flag"),
    ("/a:/x,/b:/x", "two mounts on '/x': '/a:/x' and '/b:/x'"),
    ("/a:/x,/a:/x:ro", "two mounts on '/x'"),
    ("/a:/x,,/b:/y", "bad entry ''"),
    ("/a:/x,", "bad entry ''"),
    ("/a:/b:ro:x", "bad entry '/a:/b:ro:x'"),
    (":/x", "bad entry ':/x'"),
    ("/my data:/data", "white space"),
])
def test_bad_mounts_name_the_entry(text, words):
    with pytest.raises(ValueError) as e:
        parse_mounts(text)
    assert str(e.value).startswith("--container-mounts: ") and words in str(e.value), str(e.value)
