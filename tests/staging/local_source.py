"""A stand-in for `staging.source.fetch` and `staging.checksum.of_local` in the cache's tests: a
local copy and the checksum of `staging/types.py` (until the catalogue's modules land, and to
script a copy that fails or changes under the cache)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from trainyard.staging.types import NOT_FOUND, DataStagingError, DatasetRef


def digest(path: str) -> str:
    """sha256 of a file's bytes; for a directory, of one line `<rel>\\0<size>\\0<hex>\\n` per file."""
    p = Path(path)
    if p.is_file():
        return "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest()
    lines = []
    for f in sorted(x for x in p.rglob("*") if x.is_file()):
        lines.append(f"{f.relative_to(p).as_posix()}\0{f.stat().st_size}\0"
                     f"{hashlib.sha256(f.read_bytes()).hexdigest()}\n")
    return "sha256:" + hashlib.sha256("".join(lines).encode()).hexdigest()


class Copier:
    """`fetch(source, access, reader, dest)`: copies a local path; counts its copies."""

    def __init__(self) -> None:
        self.copies: list[str] = []
        self.before_return = None  # a callable run after the copy (to race, or to crash)

    def __call__(self, source, access, reader, dest, *, label=None) -> None:
        if not os.path.exists(source):
            raise DataStagingError(NOT_FOUND, source, "no such file")
        if os.path.isdir(source):
            shutil.copytree(source, dest)
        else:
            shutil.copyfile(source, dest)
        self.copies.append(source)
        if self.before_return is not None:
            self.before_return()


def ref_of(path: Path, name: str = "corpus", version: str = "v1") -> DatasetRef:
    size = path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return DatasetRef(name=name, version=version, source=str(path), checksum=digest(str(path)), bytes=size)
