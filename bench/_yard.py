"""Shared by the control-plane benchmarks: a real `yard up` process, the calibration loop, teardown.

`YardServer` starts `.venv/bin/yard up --data-dir D --port 0 …` as a child process, reads the URL
from `D/server.json` and the token from `D/admin.token`, and waits for `/healthz`. `stop()` sends
SIGTERM (as an operator or systemd would), waits for the process, then kills what the local
backend left running: stopping `yard up` leaves running jobs alone by design (they are re-attached
by the next `yard up`), so a fresh `LocalBackend` on the data dir discovers their attempts from the
run files and `release()` SIGKILLs each rank's process group (checked against /proc start times,
never a recycled pid). Finally it counts processes whose command line names the data dir; the
benchmarks report that count (`leftover_processes`, 0 expected).
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _calibration import calibrate_ms  # noqa: F401 (re-exported to the benchmarks)

# The benchmarks submit as the admin token (user "admin", no Unix account): their jobs run as
# whoever runs the benchmark, said in the configuration (run_as; allow_root_jobs when root).
ME = pwd.getpwuid(os.geteuid()).pw_name
RUN_AS_ME = ["--run-as", ME, *(["--allow-root-jobs"] if os.geteuid() == 0 else [])]
IDENTITY = {"run_as": ME, "allow_root_jobs": True if os.geteuid() == 0 else None}

BIN = Path(sys.executable).parent
YARD = str(BIN / "yard")


def yard_command() -> list[str]:
    """The server command: `.venv/bin/yard`, or `$YARD_BENCH_SERVER` (e.g. another build's `yard`)."""
    return shlex.split(os.environ.get("YARD_BENCH_SERVER", "")) or [YARD]


def conditions() -> dict[str, Any]:
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(),
            "load1": round(os.getloadavg()[0], 2), "calibration_1m_loop_ms": calibrate_ms()}


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(len(s) - 1, int(k) + 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def latency_summary(ms: list[float]) -> dict[str, float]:
    return {"p50_ms": round(percentile(ms, 0.5), 2), "p95_ms": round(percentile(ms, 0.95), 2),
            "p99_ms": round(percentile(ms, 0.99), 2), "max_ms": round(max(ms), 2),
            "mean_ms": round(statistics.fmean(ms), 2)}


class YardServer:
    """One `yard up` process on its own data dir (a fresh temporary one unless given)."""

    def __init__(self, *, nodes: int | None = None, gpus_per_node: int | None = None, config: Path | None = None,
                 data_dir: Path | None = None, keep: bool = False, extra: list[str] | None = None,
                 env: dict[str, str] | None = None):
        self.data_dir = (Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="yard-bench-"))).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.keep = keep or data_dir is not None
        args = [*yard_command(), "up", "--data-dir", str(self.data_dir), "--port", "0", *RUN_AS_ME]
        if config is not None:
            args += ["--config", str(config)]
        if nodes is not None:
            args += ["--nodes", str(nodes)]
        if gpus_per_node is not None:
            args += ["--gpus-per-node", str(gpus_per_node)]
        self.args = args + list(extra or [])
        self.env = dict(env or {})  # added to the server's environment (e.g. SLURM_CONF)
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.token = ""
        self.startup_s = 0.0

    def start(self, timeout: float = 120.0) -> "YardServer":
        t0 = time.perf_counter()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("YARD_", "TRAINYARD_"))} | self.env
        self._log = open(self.data_dir / "yard-up.log", "ab")
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env)
        deadline = time.monotonic() + timeout
        info = self.data_dir / "server.json"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"yard up exited ({self.proc.returncode}): {self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"yard up did not answer /healthz in {timeout}s: {self.log_tail()}")
            try:
                meta = json.loads(info.read_text())
                if meta.get("pid") == self.proc.pid:
                    self.url = meta["url"]
                    self.token = (self.data_dir / "admin.token").read_text().strip()
                    if httpx.get(self.url + "/healthz", timeout=5).status_code == 200:
                        break
            except (OSError, ValueError, httpx.TransportError):
                pass
            time.sleep(0.05)
        self.startup_s = round(time.perf_counter() - t0, 2)
        return self

    def client(self, timeout: float = 60.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=timeout)

    def health(self) -> dict[str, Any]:
        return httpx.get(self.url + "/healthz", timeout=30).json()

    def log_tail(self, n: int = 2000) -> str:
        try:
            return (self.data_dir / "yard-up.log").read_text()[-n:]
        except OSError:
            return ""

    def stop(self) -> dict[str, Any]:
        """SIGTERM the server, kill the ranks it left running, report what is left (nothing, we hope)."""
        out: dict[str, Any] = {}
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                out["server_killed"] = True
        if self.proc is not None:
            out["server_exit"] = self.proc.returncode
            self._log.close()
        from trainyard.backends.local.backend import LocalBackend

        be = LocalBackend(self.data_dir, [])
        left = [(a.job_id, a.attempt) for a in be.poll()]
        for jid, att in left:
            be.release(jid, att)
        out["attempts_killed_after_stop"] = len(left)
        out["leftover_processes"] = len(processes_naming(self.data_dir))
        if not self.keep:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        return out

    def __enter__(self) -> "YardServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.stop()


def processes_naming(path: Path) -> list[int]:
    """Pids of live processes whose command line mentions `path` or whose working directory is in it
    (our server, the rank runners, and the jobs' commands, which run in the data dir)."""
    needle = str(path).encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
            try:
                cwd = os.readlink(f"/proc/{name}/cwd")
            except OSError:
                cwd = ""
            if needle in cmdline or cwd == str(path) or cwd.startswith(str(path) + "/"):
                with open(f"/proc/{name}/stat", "rb") as g:
                    state = g.read().rsplit(b")", 1)[1].split()[0]
                if state not in (b"Z", b"X"):
                    found.append(int(name))
        except OSError:
            pass
    return found
