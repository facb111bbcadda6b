"""Issue 41: what one object-store operation of the plane costs the plane's other threads, with a
new botocore session per S3 client (what the archive and the dataset sources did) against the one
shared session per process (`staging.objects.session`).

A new session parses botocore's S3 models (megabytes of JSON) in long holds of the GIL, during
which no other thread of the plane (its API, its loop) runs. Each round makes a client and asks a
real SeaweedFS S3 server on loopback for one object's size, as the tiers thread and a staging do;
a ticker thread beside it sleeps 1 ms at a time and records its longest wait for the GIL.

    .venv/bin/python bench/s3_client.py [--rounds 20] [--json FILE]

Figures: the CPU time and wall time of one round, and the ticker's longest stall, min/median/max
over the rounds (the first round of each way is a warm-up, not counted).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.staging.seaweed import seaweed_server  # noqa: E402
from trainyard.staging import objects  # noqa: E402


class Ticker:
    """A thread that wakes every millisecond and keeps its longest wait beyond that."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            self.worst = max(self.worst, now - last - 0.001)
            last = now

    def reset(self) -> None:
        self.worst = 0.0

    def stop(self) -> None:
        self._stop.set()
        self._t.join()


def new_session_fs(options: dict[str, object]) -> Any:
    """As before: a client on a session of its own."""
    import fsspec  # type: ignore[import-untyped]

    config = {"connect_timeout": 60.0, "read_timeout": 60.0, "retries": {"max_attempts": 3, "mode": "standard"}}
    return fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False, config_kwargs=config,
                             **options)


def shared_session_fs(options: dict[str, object]) -> Any:
    return objects.filesystem(options, 60.0)


def measure(make: Callable[[dict[str, object]], Any], options: dict[str, object], path: str, rounds: int,
            ticker: Ticker) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"cpu_ms": [], "wall_ms": [], "stall_ms": []}
    for i in range(rounds + 1):
        ticker.reset()
        c0, w0 = time.process_time(), time.perf_counter()
        size = make(options).info(path)["size"]
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        assert size > 0
        if i:  # the first: a warm-up (imports, the shared session's one parse)
            out["cpu_ms"].append(cpu * 1000)
            out["wall_ms"].append(wall * 1000)
            out["stall_ms"].append(ticker.worst * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    with seaweed_server(Path(tempfile.mkdtemp(prefix="bench-s3c-"))) as sw:
        url = sw.put("obj.bin", b"x" * 4096)
        options = sw.object_store().fsspec_options()
        path = url[len("s3://"):]
        ticker = Ticker()
        try:
            for way, make in (("a new session per client (before)", new_session_fs),
                              ("one shared session (now)", shared_session_fs)):
                got = measure(make, options, path, a.rounds, ticker)
                row: dict[str, Any] = {"way": way}
                for k, v in got.items():
                    row[k] = [round(min(v), 1), round(statistics.median(v), 1), round(max(v), 1)]
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            ticker.stop()
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
