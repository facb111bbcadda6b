"""A dataset's checksum, as `staging/types.py` defines it, computed streaming (memory bounded by
the number of files, never by their size).

    sha256:<hex>   a file: the sha256 of its bytes
                   a directory: the sha256 of one line `<relative path>\\0<size>\\0<sha256 hex>\\n`
                   per regular file below it, sorted by path (as bytes; `/` between the parts)

    of_local(path)                       a file or directory on this machine (a staged copy)
    of_source(source, access, reader)    a dataset's source, read as `source.fetch` reads it

An empty directory counts for nothing (object stores have none), so a directory source and its
copy from an object store agree. `of_local` walks as `staging/local_tree.py` does: no link is
followed, a link or FIFO in it is refused. `of_source` of a path hashes in the reading child (as
the reader, `staging/as_reader.py`): only the answer crosses the pipe.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

from trainyard.staging import objects
from trainyard.staging.as_reader import ChildFailed, Send, Stalled, reading_as
from trainyard.staging.local_tree import NotPlain, Visitor, read_chunks, walk
from trainyard.staging.source import check_source, from_child, from_store, is_path, store_of
from trainyard.staging.types import CHECKSUM_RE, FORBIDDEN, DataStagingError, Reader, SourceAccess

PREFIX = "sha256:"


@dataclass
class TreeSum:
    """A checksum being made: add each regular file (its path below the source, its size, its
    sha256), then `value()`. A file source adds one entry with the path b""."""

    entries: list[tuple[bytes, int, str]] = field(default_factory=list)

    def add(self, rel: bytes, size: int, hexdigest: str) -> None:
        self.entries.append((rel, size, hexdigest))

    def value(self, kind: str) -> str:
        if kind == "file":
            (_, _, hexdigest), = self.entries
            return PREFIX + hexdigest
        h = hashlib.sha256()
        for rel, size, hexdigest in sorted(self.entries):
            h.update(rel + b"\0" + str(size).encode() + b"\0" + hexdigest.encode() + b"\n")
        return PREFIX + h.hexdigest()


def is_checksum(value: str) -> bool:
    return bool(CHECKSUM_RE.match(value))


def _hash_fd(fd: int) -> tuple[int, str]:
    h = hashlib.sha256()
    n = read_chunks(fd, h.update)
    return n, h.hexdigest()


def _tree_work(path: str) -> Any:
    def work(send: Send | None) -> dict[str, Any]:
        total = TreeSum()

        def on_file(rel: bytes, fd: int, size: int) -> None:
            n, hexdigest = _hash_fd(fd)
            total.add(rel, n, hexdigest)
            if send is not None:
                send(b"P", b"")

        kind = walk(path, Visitor(on_dir=lambda rel: None, on_file=on_file))
        return {"checksum": total.value(kind), "kind": kind, "bytes": sum(e[1] for e in total.entries),
                "files": len(total.entries)}
    return work


def of_local(path: str | os.PathLike[str]) -> str:
    """The checksum of a file or directory on this machine, read as the caller, through no link.

    Raises:
        DataStagingError: FORBIDDEN, when it holds a link, a FIFO or a device.
        OSError: missing, no permission, an I/O error.
    """
    p = os.fspath(path)
    try:
        return str(_tree_work(p)(None)["checksum"])
    except NotPlain as e:
        raise DataStagingError(FORBIDDEN, p, e.strerror or str(e)) from None


def of_source(source: str, access: SourceAccess, reader: Reader | None, *, label: str | None = None) -> str:
    """The checksum of a dataset's source, read as `staging/source.py` reads it (a path as `reader`,
    an s3:// URL with its store's credentials).

    Raises:
        DataStagingError: NOT_FOUND, FORBIDDEN or UNREACHABLE, as `source.fetch`.
    """
    return summary_of_source(source, access, reader, label=label)["checksum"]


def summary_of_source(source: str, access: SourceAccess, reader: Reader | None, *,
                      label: str | None = None) -> dict[str, Any]:
    """`{"checksum", "kind", "bytes", "files"}` of a source, in one read (what `yard dataset add` records)."""
    label = label or source
    check_source(source, label)
    if is_path(source):
        try:
            with reading_as(reader, _tree_work(source), access.timeout_s) as frames:
                for _ in frames:
                    pass
                return dict(frames.answer)
        except (ChildFailed, Stalled) as e:
            raise from_child(e, source, label, access.timeout_s) from None
    store = store_of(source, access, label)
    total = TreeSum()
    try:
        fs = objects.filesystem(store.fsspec_options(), access.timeout_s)
        kind, found = objects.listing(fs, source)

        def one(item: tuple[str, str, int]) -> None:
            h = hashlib.sha256()
            n = objects.read_object(fs, item[1], h.update)
            total.add(item[0].encode(), n, h.hexdigest())  # (list.append: safe from the reading threads)

        objects.each(found, one)
    except Exception as e:  # noqa: BLE001 - sorted into the kinds
        raise from_store(e, source, label) from None
    return {"checksum": total.value(kind), "kind": kind, "bytes": sum(e[1] for e in total.entries),
            "files": len(total.entries)}
