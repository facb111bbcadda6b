"""Keystroke echo round trip through the terminal API on loopback (issue 38: goal p99 ≤ 50 ms).

    PYTHONPATH=src:. python -m tests.api.echo_latency [N [YARD_URL TOKEN JOB]]

A fake plane under a real uvicorn (tests/api/terminal_plane.py), a `websockets` client, bash with
readline on the far pty: each key is one binary frame, and the time is until its echo comes back.
With a URL, a token and a running job, it measures that plane instead (a real `yard up`). Not a test (timings are never asserted, docs/architecture.md): it prints p50, p99 and max.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from websockets.asyncio.client import connect

from tests.api import terminal_plane


BASH = "cmd=env&cmd=PS1=@@>%20&cmd=bash&cmd=--norc&cmd=--noprofile"


async def measure(url: str, token: str, n: int) -> list[float]:
    times = []
    async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, compression=None) as ws:
        buf = b""
        while b"@@> " not in buf:
            buf += await ws.recv()
        for i in range(n):
            key = b"abcdefghij"[i % 10:i % 10 + 1]
            t0 = time.perf_counter()
            await ws.send(key)
            got = b""
            while key not in got:
                got += await ws.recv()
            times.append(time.perf_counter() - t0)
            if i % 50 == 49:
                await ws.send(b"\x15")  # Ctrl-U: clear the line
                await asyncio.sleep(0.05)
                while True:
                    try:
                        await asyncio.wait_for(ws.recv(), 0.05)
                    except asyncio.TimeoutError:
                        break
        await ws.send(b"\x15exit\r")
    return times


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    if len(sys.argv) > 4:
        base, token, job = sys.argv[2:5]
        report(n, sorted(x * 1000 for x in asyncio.run(measure(f"ws{base[4:]}/api/v1/jobs/{job}/terminal?{BASH}", token, n))))
        return
    with tempfile.TemporaryDirectory() as d:
        served, server, thread = terminal_plane.serve(Path(d) / "d")
        try:
            url = f"ws{served.url[4:]}/api/v1/jobs/{served.running}/terminal?{BASH}"
            ms = sorted(x * 1000 for x in asyncio.run(measure(url, served.alice, n)))
        finally:
            terminal_plane.stop(served, server, thread)
    report(n, ms)


def report(n: int, ms: list[float]) -> None:
    p = statistics.quantiles(ms, n=100)
    print(f"{n} keystrokes: p50 {p[49]:.2f} ms, p99 {p[98]:.2f} ms, max {ms[-1]:.2f} ms")


if __name__ == "__main__":
    main()
