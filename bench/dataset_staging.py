"""Issue 41's staging figures (bench/README.md, "Datasets staged on the nodes"): what a node's first
staging of a dataset costs and what a cached start costs, through the very cache the backends use
(`staging/cache.py` with `staging/source.py`'s copy and `staging/checksum.py`'s hash).

    .venv/bin/python bench/dataset_staging.py [--mb 256] [--files 1] [--rounds 3] [--json FILE]

For each round: a fresh node cache, the dataset (a file of `--mb` MB, or a directory of `--files`
files of that total) staged once cold (copy, verify, rename) and once warm (found: the cached
start), and the same file read once end to end from its source for comparison (what a job reading
it where it lies pays on this disk). Run as root, as the plane. The source is a local path here;
an object store's copy adds its network time to the cold figure only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "src")]

from _calibration import calibrate_ms  # noqa: E402

from trainyard.staging.cache import NodeDatasetCache  # noqa: E402
from trainyard.staging.checksum import of_local  # noqa: E402
from trainyard.staging.types import DatasetRef, SourceAccess  # noqa: E402

CHUNK = 1 << 20


def _make(top: Path, mb: int, files: int) -> Path:
    block = os.urandom(CHUNK)
    if files <= 1:
        path = top / "corpus.bin"
        with open(path, "wb") as f:
            for _ in range(mb):
                f.write(block)
        return path
    path = top / "shards"
    path.mkdir()
    per = max(1, mb // files)
    for i in range(files):
        with open(path / f"shard-{i:05d}.bin", "wb") as f:
            for _ in range(per):
                f.write(block)
    return path


def _read_all(path: Path) -> float:
    began = time.monotonic()
    h = hashlib.sha256()
    for p in ([path] if path.is_file() else sorted(path.rglob("*"))):
        if p.is_file():
            with open(p, "rb") as f:
                while chunk := f.read(CHUNK):
                    h.update(chunk)
    return time.monotonic() - began


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--files", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    loop_ms = calibrate_ms()
    with tempfile.TemporaryDirectory(prefix="ty-stage-bench-") as d:
        top = Path(d)
        src = _make(top, a.mb, a.files)
        ref = DatasetRef("corpus", "v1", str(src), of_local(src), a.mb * CHUNK)
        cold, warm, direct = [], [], []
        for r in range(a.rounds):
            cache = NodeDatasetCache(top / f"cache-{r}", None, "node-0")
            cold.append(cache.stage(ref, SourceAccess()).seconds)
            warm.append(cache.stage(ref, SourceAccess()).seconds)
            direct.append(_read_all(src))
    out = {"mb": a.mb, "files": a.files, "rounds": a.rounds, "cold_s": statistics.median(cold),
           "cold_mb_s": a.mb / statistics.median(cold), "warm_ms": 1000 * statistics.median(warm),
           "read_in_place_s": statistics.median(direct), "loop_1m_ms": loop_ms,
           "load": os.getloadavg()[0]}
    print(json.dumps(out, indent=1))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
