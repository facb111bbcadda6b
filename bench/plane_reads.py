"""What a job's files cost the plane (issue 34): its memory while it serves a 1 GB log and an 800 MB
metrics file, and how long a FIFO left where it reads holds its loop.

    .venv/bin/python bench/plane_reads.py [--json out.json]
    YARD_BENCH_SERVER="env PYTHONPATH=/path/to/old/src .venv/bin/yard" .venv/bin/python bench/plane_reads.py --plants fifo

A real `yard up` (bench/_yard.py) on one emulated node; one job leaves a sparse 1 GB log and an
800 MB metrics.jsonl (200,000 step records, then a sparse tail); the plane's peak resident set
(VmHWM, reset through /proc/<pid>/clear_refs before each read, so each figure is that read's
peak) is read while (a) one GET of the log (the default page), (b) the whole log through
`yard logs` (page by page), (c) the dashboard's job page (its loss curve and log tail) are served.
Then a job plants a FIFO (and one a link to /dev/zero) at metrics.jsonl and exits 1: the time
from its submission to its FAILED record, against a job that just exits 1 in the same run, and
the time the next job takes to run, against the same. A read that holds the plane longer than
`--wait` seconds is reported as held (`null` and a note): the loop never came back.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from _yard import YARD, YardServer, conditions

METRICS = '"$(dirname "$TRAINYARD_CHECKPOINT_DIR")/metrics/metrics.jsonl"'
LOG = '"$(dirname "$TRAINYARD_CHECKPOINT_DIR")/logs/rank-0.log"'
WRITE_METRICS = ("python3 -c 'import json,sys\nwith open(sys.argv[1], \"a\") as f:\n"
                 "    for i in range(200000): f.write(json.dumps({\"step\": i, \"loss\": 1.0/(i+1), \"attempt\": 1, "
                 "\"time\": 0.0}) + \"\\n\")' ")


def _status(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024


def peak_during(pid: int, fn) -> tuple[float, float, Any]:  # noqa: ANN001
    """(MiB the plane's peak RSS rose above its RSS before, seconds, fn's result)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = _status(pid, "VmRSS")
    t = time.perf_counter()
    out = fn()
    return round(_status(pid, "VmHWM") - before, 1), round(time.perf_counter() - t, 2), out


def submit(c: httpx.Client, command: str, workdir: str) -> int:
    r = c.post("/api/v1/jobs", json={"command": ["/bin/sh", "-c", command], "team": "default", "workdir": workdir})
    r.raise_for_status()
    return int(r.json()["id"])


def wait_end(c: httpx.Client, job: int, wait: float) -> tuple[str | None, float]:
    t = time.monotonic()
    while time.monotonic() - t < wait:
        try:
            j = c.get(f"/api/v1/jobs/{job}", timeout=5).json()
        except httpx.TransportError:
            time.sleep(0.1)
            continue
        if j["state"] in ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY"):
            return j["state"], round(time.monotonic() - t, 2)
        time.sleep(0.05)
    return None, round(time.monotonic() - t, 2)


def run(wait: float, plants: tuple[str, ...] = ("fifo", "dev_zero_link")) -> dict[str, Any]:
    out: dict[str, Any] = {"conditions": conditions()}
    with YardServer(nodes=1, gpus_per_node=1) as y:
        c, pid, work = y.client(timeout=120), y.proc.pid, str(y.data_dir)
        big = submit(c, f"truncate -s 1G {LOG}; {WRITE_METRICS} {METRICS}; truncate -s 800M {METRICS}", work)
        assert wait_end(c, big, 300)[0] == "COMPLETED", y.log_tail()
        env = {"YARD_URL": y.url, "YARD_TOKEN": y.token, "PATH": "/usr/bin:/bin"}
        out["idle_rss_mib"] = round(_status(pid, "VmRSS"), 1)
        out["log_page"] = dict(zip(("peak_growth_mib", "s", "bytes"), peak_during(
            pid, lambda: len(c.get(f"/api/v1/jobs/{big}/logs").content))))
        out["log_whole_via_yard_logs"] = dict(zip(("peak_growth_mib", "s", "rc"), peak_during(
            pid, lambda: subprocess.run([YARD, "logs", str(big)], env=env, stdout=subprocess.DEVNULL,
                                        timeout=wait * 10).returncode)))
        ui = httpx.Client(base_url=y.url, timeout=120)
        ui.post("/ui/login", data={"token": y.token})
        out["dashboard_job_page"] = dict(zip(("peak_growth_mib", "s", "status"), peak_during(
            pid, lambda: ui.get(f"/ui/jobs/{big}").status_code)))
        plain = submit(c, "exit 1", work)
        out["plain_failure"] = dict(zip(("state", "s"), wait_end(c, plain, wait)))
        for name, plant in (("fifo", "mkfifo"), ("dev_zero_link", "ln -s /dev/zero")):
            if name not in plants:
                continue
            j = submit(c, f"rm -f {METRICS}; {plant} {METRICS}; exit 1", work)
            state, s = wait_end(c, j, wait)
            nxt = submit(c, "true", work) if state else None
            after = wait_end(c, nxt, wait) if nxt else (None, None)
            out[name] = {"state": state, "s": s if state else None, "next_job": after[0], "next_job_s": after[1],
                         "note": "" if state else f"held the loop for more than {wait:g} s"}
        out["stop"] = y.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wait", type=float, default=60.0, help="seconds before a hold counts as for ever")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plants", default="fifo,dev_zero_link", help="what a job plants at metrics.jsonl (a plane "
                    "before issue 34 reads a link to /dev/zero until its memory is gone: leave it out there)")
    a = ap.parse_args()
    out = run(a.wait, tuple(x for x in a.plants.split(",") if x))
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        a.json.write_text(text + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
