"""Issue 41's end-to-end figure (bench/README.md, "A job's first step on a 1 GB dataset"): how long a
job waits for its first step when its data is in an object store, read three ways in the same run:

- direct: the job reads the objects itself (s3fs in the job, the store's credentials in its
  environment), as a job without the catalogue would;
- staged, first job: the node's cache copies and verifies the dataset (`staging/cache.py` with
  `staging/source.py`'s copy and `staging/checksum.py`'s hash, as `control/loop/data_staging.py`
  does before the ranks start), then the job reads the copy;
- staged, cached: a later job on the node: the entry is found, the job reads the copy.

    .venv/bin/python bench/dataset_first_step.py [--mb 1024] [--files 8] [--rounds 3] [--json FILE]

The dataset is `--files` binary shards of `--mb` MB in all (`dataset_staging._make`), put in a real
SeaweedFS S3 server on loopback (tests/staging/seaweed.py). "The job" is a fresh Python process
(`JOB` below: its imports, then every shard read once in 8 MiB blocks, as the recipes read all of
`data.path` into their token cache before step 1); its time to first step is its whole wall time,
from spawn to exit. Each round uses a fresh node cache (removed after the round: /tmp is small).
The local copy is read right after it was written (the page cache holds it, as it would on a node
that just staged it), and once more for the cached job after its pages were dropped
(`posix_fadvise(DONTNEED)` on the copy's files only: the disk's read, as on a node that staged it
long before). The store's own files are in the page cache too (just uploaded). Run as root, as the
plane.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "src"), str(ROOT)]

from _calibration import calibrate_ms  # noqa: E402
from dataset_staging import _make  # noqa: E402

from tests.staging.seaweed import seaweed_server  # noqa: E402
from trainyard.staging import checksum  # noqa: E402
from trainyard.staging.cache import NodeDatasetCache  # noqa: E402
from trainyard.staging.types import DatasetRef, SourceAccess  # noqa: E402

BLOCK = 8 << 20
# The job: argv[1] is a local path or an s3:// prefix; every file under it read once, in name order.
JOB = f"""
import os, sys
src = sys.argv[1]
n = 0
if src.startswith("s3://"):
    import s3fs
    fs = s3fs.S3FileSystem(key=os.environ["AWS_ACCESS_KEY_ID"], secret=os.environ["AWS_SECRET_ACCESS_KEY"],
                           client_kwargs={{"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}})
    for p in sorted(fs.find(src)):
        with fs.open(p, "rb", block_size={BLOCK}) as f:
            while b := f.read({BLOCK}):
                n += len(b)
else:
    files = [src] if os.path.isfile(src) else sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs)
    for p in files:
        with open(p, "rb") as f:
            while b := f.read({BLOCK}):
                n += len(b)
print(n)
"""


def _job(src: str, env: dict[str, str]) -> tuple[float, int]:
    """(wall seconds from spawn to exit, bytes read) of one job reading `src`."""
    began = time.monotonic()
    out = subprocess.run([sys.executable, "-c", JOB, src], env=env, capture_output=True, text=True, check=True)
    return time.monotonic() - began, int(out.stdout.strip())


def _evict(path: Path) -> None:
    """Drop the copy's pages from the page cache (only its files: the machine is shared), as on a
    node that staged it long before the job starts."""
    for p in [path] if path.is_file() else sorted(x for x in path.rglob("*") if x.is_file()):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _stats(xs: list[float]) -> dict[str, float]:
    return {"min": round(min(xs), 3), "median": round(statistics.median(xs), 3), "max": round(max(xs), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    size = a.mb << 20
    loop_ms = calibrate_ms()
    top = Path(tempfile.mkdtemp(prefix="ty-first-step-"))
    try:
        with seaweed_server(top / "seaweed") as sw:
            local = _make(top, a.mb, a.files)
            began = time.monotonic()
            sw._filesystem().put(str(local), f"{sw.bucket}/corpus", recursive=True)
            upload_s = time.monotonic() - began
            shutil.rmtree(local) if local.is_dir() else local.unlink()
            url = sw.url("corpus" if a.files > 1 else f"corpus/{local.name}")
            access = SourceAccess(stores=(sw.object_store(),), timeout_s=600)
            ref = DatasetRef("corpus", "v1", url, checksum.of_source(url, access, None), size)
            job_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(top), "OMP_NUM_THREADS": "1",
                       "AWS_ACCESS_KEY_ID": sw.key, "AWS_SECRET_ACCESS_KEY": sw.secret,
                       "AWS_ENDPOINT_URL": sw.endpoint_url}
            plain_env = {k: v for k, v in job_env.items() if not k.startswith("AWS_")}
            direct, staging, first, cached_find, cached, cached_cold = [], [], [], [], [], []
            for r in range(a.rounds):
                took, n = _job(url, job_env)
                assert n == size, (n, size)
                direct.append(took)
                cache = NodeDatasetCache(top / f"cache-{r}", None, "node-0")
                got = cache.stage(ref, access)
                assert got.copied
                read, n = _job(str(got.path), plain_env)
                assert n == size, (n, size)
                staging.append(got.seconds)
                first.append(got.seconds + read)
                again = cache.stage(ref, access)
                assert not again.copied
                read, _ = _job(str(again.path), plain_env)
                cached_find.append(again.seconds)
                cached.append(again.seconds + read)
                _evict(Path(again.path))
                read, _ = _job(str(again.path), plain_env)
                cached_cold.append(again.seconds + read)
                for top_, _, _ in os.walk(cache.root):  # entries are read-only, the plane's included
                    os.chmod(top_, 0o755)
                shutil.rmtree(cache.root)
                print(json.dumps({"round": r + 1, "direct_s": round(direct[-1], 3), "staging_s": round(staging[-1], 3),
                                  "first_job_s": round(first[-1], 3), "cached_job_s": round(cached[-1], 3),
                                  "cached_cold_s": round(cached_cold[-1], 3)}),
                      flush=True)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    med = statistics.median
    out = {"mb": a.mb, "files": a.files, "rounds": a.rounds, "upload_s": round(upload_s, 3),
           "direct_first_step_s": _stats(direct), "staged_first_job_first_step_s": _stats(first),
           "staging_s": _stats(staging), "staging_mb_s": round(a.mb / med(staging), 1),
           "cached_find_ms": round(1000 * med(cached_find), 2), "cached_job_first_step_s": _stats(cached),
           "cached_job_cold_page_cache_first_step_s": _stats(cached_cold),
           "ratio_direct_over_first_job": round(med(direct) / med(first), 2),
           "ratio_direct_over_cached_job": round(med(direct) / med(cached), 2),
           "ratio_direct_over_cached_cold": round(med(direct) / med(cached_cold), 2),
           "loop_1m_ms": loop_ms, "load": round(os.getloadavg()[0], 1)}
    print(json.dumps(out, indent=1))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
