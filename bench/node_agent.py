"""Benchmark: what the node agent costs — sampling one node's GPUs at 1 Hz (issue 39, per-GPU telemetry).

    .venv/bin/python bench/node_agent.py [--gpus 8] [--seconds 30] [--hz 1] [--containment auto]

One emulated node with `--gpus` GPUs and one real rank on each (a sleeping process in the
attempt's cell, as the local backend launches it: runner, cgroups, logs), then
`LocalBackend.gpu_readings()` every 1/`--hz` s for `--seconds`, as the plane's sampler calls it.
Measured: this process's CPU time (user + system, `time.process_time`) over the wall time of the
sampling — the share of one core the agent takes — and the CPU and wall time per reading. The
emulated source reads, per rank, the run dir's attempt.json and rank record, its cgroup's CPU
counter and its processes' resident memory (/proc), so the cost grows with the ranks; on real
GPUs NVML's four calls per GPU replace the emulation. Goal: ≤ 1% of a core at 1 Hz for 8 GPUs.
Prints one JSON object; also the 1M-addition loop calibration of bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _calibration import calibrate_ms

from trainyard.backends import LocalBackend
from trainyard.backends.base import LaunchSpec, NodeInfo
from trainyard.contracts import RankPlacement


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--hz", type=float, default=1.0)
    ap.add_argument("--containment", default="auto", help="auto | cgroup2 | cgroup1 | subreaper")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ty-agent-bench-") as tmp:
        data = Path(tmp) / "data"
        data.mkdir(mode=0o711)
        be = LocalBackend(data, [NodeInfo("node0", a.gpus, "emulated", 16384)], containment=a.containment)
        job = data / "jobs" / "1"
        be.launch(LaunchSpec(1, 1, ["sleep", "3600"], str(data), str(job),
                             [RankPlacement(r, "node0", (r,)) for r in range(a.gpus)], {}, str(job / "ckpt")))
        try:
            be.gpu_readings()  # the first sight: each rank's first CPU reading
            period = 1.0 / a.hz
            per_call_cpu, per_call_wall, read = [], [], 0
            w0, c0 = time.perf_counter(), time.process_time()
            nxt = w0
            while time.perf_counter() - w0 < a.seconds:
                nxt += period
                time.sleep(max(0.0, nxt - time.perf_counter()))
                t, c = time.perf_counter(), time.process_time()
                got = be.gpu_readings()
                per_call_wall.append(time.perf_counter() - t)
                per_call_cpu.append(time.process_time() - c)
                read = len(got)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        finally:
            be.release(1, 1)
            be.close()
    per_call_cpu.sort()
    per_call_wall.sort()
    print(json.dumps({
        "gpus": a.gpus, "hz": a.hz, "seconds": round(wall, 1), "readings": len(per_call_cpu),
        "gpus_read_per_call": read, "containment": be.containment,
        "cpu_share_of_a_core": round(cpu / wall, 5),
        "cpu_ms_per_call_median": round(1000 * per_call_cpu[len(per_call_cpu) // 2], 3),
        "wall_ms_per_call_median": round(1000 * per_call_wall[len(per_call_wall) // 2], 3),
        "wall_ms_per_call_max": round(1000 * per_call_wall[-1], 3),
        "load_avg_1m": round(os.getloadavg()[0], 2), "calibration_1m_loop_ms": calibrate_ms(),
        "python": sys.version.split()[0],
    }, indent=1))


if __name__ == "__main__":
    main()
