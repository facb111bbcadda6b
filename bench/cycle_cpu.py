"""One trainyard cycle on `yard bench sched`'s synthetic snapshot, measured in CPU time.

    PYTHONPATH=src python bench/cycle_cpu.py [N]

Why: `yard bench sched` reports wall time, which on a shared 2-core machine moves with the other
processes by 1.5x and more; the process's CPU time (median of N cycles, default 9) moves less, and
the Python calls of one cycle (a `sys.setprofile` count) not at all. Run it interleaved with the
build before a change (a worktree on `PYTHONPATH`) to compare the two.
"""

from __future__ import annotations

import statistics
import sys
import time

from trainyard.sched.engine import TrainyardPolicy
from trainyard.sched.synthetic_snapshot import build_snapshot


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    snap = build_snapshot()
    policy = TrainyardPolicy()
    policy.cycle(snap)  # warm
    times = []
    for _ in range(n):
        t = time.process_time()
        policy.cycle(snap)
        times.append((time.process_time() - t) * 1000)
    calls = [0]

    def count(frame, event, arg):
        if event == "call":
            calls[0] += 1

    sys.setprofile(count)
    policy.cycle(snap)
    sys.setprofile(None)
    print(f"cpu median {statistics.median(times):.1f} ms, min {min(times):.1f} ms, calls {calls[0]}")


if __name__ == "__main__":
    main()
