"""Issue 41: what reading a dataset's source costs (`staging/source.py`, `staging/checksum.py`):
the rate of `yard dataset add` (one full read to hash it) and of a node's copy (`fetch`), for a path
read as the plane and as another account (the forked reader streaming through a pipe), and for an
object in a real SeaweedFS S3 server on loopback.

    .venv/bin/python bench/dataset_source.py [--mib 256] [--files 1000] [--rounds 3] [--json FILE]

Run as root for the "as another account" rows (a throwaway `useradd` account); each figure is the
median of `--rounds`, after one warm-up read (the page cache is warm: these are the layer's own
costs, not the disk's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.accounts import accounts, shared_dir  # noqa: E402
from tests.staging.seaweed import seaweed_server  # noqa: E402
from trainyard.staging import checksum, source  # noqa: E402
from trainyard.staging.types import Reader, SourceAccess  # noqa: E402


def _median(fn, rounds: int) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _fetch(src: str, access: SourceAccess, reader: Reader | None, scratch: Path):
    def run() -> None:
        dest = scratch / "copy"
        source.fetch(src, access, reader, str(dest))
        shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows: list[dict] = []
    blob = os.urandom(a.mib << 20)
    with shared_dir("bench-ds-") as d, accounts({"reader": []}, []) as acc:
        big = d / "big.bin"
        big.write_bytes(blob)
        tree = d / "tree"
        tree.mkdir()
        for i in range(a.files):
            (tree / f"{i:05d}.jsonl").write_bytes(os.urandom(4096))
        for p in (big, tree, *tree.iterdir()):
            p.chmod(0o755 if p.is_dir() else 0o644)
        scratch = Path(tempfile.mkdtemp(prefix="bench-ds-out-"))
        import pwd

        pw = pwd.getpwnam(acc.user("reader"))
        other = Reader(pw.pw_uid, pw.pw_gid, (pw.pw_gid,))
        access = SourceAccess(timeout_s=60)
        for what, src, size in ((f"file {a.mib} MiB", str(big), a.mib << 20),
                                (f"{a.files} files of 4 KiB", str(tree), a.files * 4096)):
            for who, reader in (("plane", None), ("another account", other)):
                for op, fn in (("checksum (add)", lambda: checksum.of_source(src, access, reader)),
                               ("fetch (a node's copy)", _fetch(src, access, reader, scratch))):
                    s = _median(fn, a.rounds)
                    rows.append({"source": f"path, {what}", "as": who, "op": op, "seconds": round(s, 3),
                                 "MiB/s": round(size / s / 2**20, 1)})
                    print(json.dumps(rows[-1]), flush=True)
        with seaweed_server(Path(tempfile.mkdtemp(prefix="bench-ds-sw-"))) as sw:
            url = sw.put("big.bin", blob)
            for i in range(min(a.files, 200)):
                sw.put(f"tree/{i:05d}.jsonl", os.urandom(4096))
            s3 = SourceAccess(stores=(sw.object_store(),), timeout_s=60)
            for what, src, size in ((f"object {a.mib} MiB", url, a.mib << 20),
                                    (f"{min(a.files, 200)} objects of 4 KiB", sw.url("tree"), min(a.files, 200) * 4096)):
                for op, fn in (("checksum (add)", lambda: checksum.of_source(src, s3, None)),
                               ("fetch (a node's copy)", _fetch(src, s3, None, scratch))):
                    s = _median(fn, a.rounds)
                    rows.append({"source": f"s3 (SeaweedFS, loopback), {what}", "as": "plane", "op": op,
                                 "seconds": round(s, 3), "MiB/s": round(size / s / 2**20, 1)})
                    print(json.dumps(rows[-1]), flush=True)
        shutil.rmtree(scratch, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
