"""Benchmark: the checkpoint archive tier (issue 41) — how fast a step goes to the archive, and what
archiving costs a training job that runs meanwhile.

    .venv/bin/python bench/checkpoint_archive.py [--mb 256] [--reps 3] [--pairs 6] [--phase-s 4]
                                                 [--bandwidth 0] [--no-s3] [--dir DIR]

1. Throughput: one committed step of `--mb` MB (a DCP-like shard, metadata and a rank file of
   random bytes, laid out as the runtime writes them, under `--dir`: default a temporary directory
   on the disk that holds /tmp) is archived `--reps` times with `staging.archive_io.Archive.put_step`
   — exactly what the plane's thread does: every file read through `jobfs` to its manifest size,
   written to the archive, read back and its sha256 compared, the marker last — to a path archive
   (another directory on the same disk) and to a real SeaweedFS S3 server on loopback
   (tests/staging/seaweed.py). MB/s = the step's bytes over the whole copy-and-verify, median.
2. Step time: a training loop (a float32 MLP of ~8 M parameters and AdamW on one CPU thread, in a
   child process, as a job is a process apart from the plane) prints each step's time. The parent
   alternates phases of `--phase-s` seconds, `--pairs` times: none (idle) and archiving (a thread at
   nice 19 copying steps to the path archive in a loop, at `--bandwidth` MB/s, 0 = unlimited, as
   the plane's thread does). Each pair's ratio = median step time while archiving / median step
   time in the idle phase just before it; reported: the median ratio and each pair's.
   Goal: ratio ≤ 1.03.

Also reported: the load average and the 1M-addition loop calibration of bench/README.md.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from _calibration import calibrate_ms  # noqa: E402

from trainyard.jobfs import Tree  # noqa: E402
from trainyard.staging.archive_io import Archive, Throttle, read_manifest  # noqa: E402

TRAIN = r"""
import sys, time, torch
torch.set_num_threads(1)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                        torch.nn.Linear(2048, 1024))
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
x = torch.randn(32, 1024)
while True:  # until the parent ends it
    t0 = time.perf_counter()
    m(x).pow(2).mean().backward()
    opt.step(); opt.zero_grad()
    print(f"{time.time():.6f} {time.perf_counter() - t0:.6f}", flush=True)
"""


def make_step(root: Path, step: int, mb: float) -> None:
    d = root / "checkpoints" / f"step-{step}"
    d.mkdir(parents=True, exist_ok=True)
    files = {"__0_0.distcp": int(mb * 2**20), ".metadata": 4096, "rank-0.pt": 65536}
    for name, size in files.items():
        with open(d / name, "wb") as fh:
            left = size
            while left:
                n = min(left, 8 << 20)
                fh.write(os.urandom(n))
                left -= n
    (d / "COMMITTED").write_text(json.dumps({"step": step, "files": files, "metrics": {"loss": 1.0}}))


def throughput(archive: Archive, tree: Tree, reps: int) -> dict:
    m = read_manifest(tree, "checkpoints", 1)
    out = []
    for i in range(reps):
        where = archive.location(1, f"r{i}", 1)
        t0 = time.perf_counter()
        archive.put_step(tree, "checkpoints", m, where, Throttle(0))
        out.append(m.bytes / 2**20 / (time.perf_counter() - t0))
        archive.remove(where)
    return {"mb": round(m.bytes / 2**20, 1), "mb_s_median": round(statistics.median(out), 1),
            "mb_s_each": [round(x, 1) for x in out]}


def step_times(archive: Archive, tree: Tree, pairs: int, phase_s: float, mb_s: float) -> dict:
    child = subprocess.Popen([sys.executable, "-c", TRAIN], stdout=subprocess.PIPE, text=True)
    lines: list[tuple[float, float]] = []
    reader = threading.Thread(target=lambda: [lines.append(tuple(map(float, x.split()))) for x in child.stdout],
                              daemon=True)
    reader.start()
    while len(lines) < 5:  # warm-up: torch loads, the first steps allocate
        time.sleep(0.1)
    windows: list[tuple[str, float, float]] = []
    m = read_manifest(tree, "checkpoints", 1)
    copied = [0]

    def archiving(stop: threading.Event) -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # as the plane's thread
        i = 0
        while not stop.is_set():
            where = archive.location(2, f"b{i}", 1)
            archive.put_step(tree, "checkpoints", m, where, Throttle(mb_s))
            copied[0] += m.bytes
            archive.remove(where)
            i += 1

    for _ in range(pairs):
        t0 = time.time()
        time.sleep(phase_s)
        windows.append(("none", t0, time.time()))
        stop = threading.Event()
        th = threading.Thread(target=archiving, args=(stop,))
        t0 = time.time()
        th.start()
        time.sleep(phase_s)
        windows.append(("archiving", t0, time.time()))
        stop.set()
        th.join()
    child.kill()
    child.wait()
    reader.join(timeout=5)

    def med(a: float, b: float) -> float:
        return statistics.median([dt for t, dt in lines if a <= t <= b] or [float("nan")])

    ratios = []
    for (k1, a1, b1), (k2, a2, b2) in zip(windows[::2], windows[1::2]):
        ratios.append(med(a2, b2) / med(a1, b1))
    steps = [sum(1 for t, _ in lines if a <= t <= b) for _, a, b in windows]
    base = [med(a, b) for k, a, b in windows if k == "none"]
    return {"pairs": pairs, "phase_s": phase_s, "bandwidth_mb_s": mb_s,
            "step_ms_idle_median": round(statistics.median(base) * 1000, 2),
            "ratio_median": round(statistics.median(ratios), 4), "ratios": [round(r, 4) for r in ratios],
            "archived_mb_s_during": round(copied[0] / 2**20 / (pairs * phase_s), 1),
            "steps_per_phase_min": min(steps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--phase-s", type=float, default=4.0)
    ap.add_argument("--bandwidth", type=float, default=0.0)
    ap.add_argument("--no-s3", action="store_true")
    ap.add_argument("--dir")
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ckpt-archive-", dir=a.dir or "/var/tmp"))
    out: dict = {"load": os.getloadavg(), "calibration_ms": calibrate_ms(reps=1), "dir": str(base)}
    try:
        make_step(base / "job", 1, a.mb)
        tree = Tree(base / "job")
        path_archive = Archive(str(base / "archive"))
        out["path"] = throughput(path_archive, tree, a.reps)
        if not a.no_s3:
            from tests.staging.seaweed import seaweed_server

            with seaweed_server(base / "seaweed") as s3:
                out["s3"] = throughput(Archive(s3.url("ckpt"), s3.object_store()), tree, a.reps)
        out["step_time"] = step_times(path_archive, tree, a.pairs, a.phase_s, a.bandwidth)
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
