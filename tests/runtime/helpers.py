"""Launch the test training job (`train_script.py`) as real processes and read what it left.

Ranks are started the way trainyard's local backend starts them: one process per rank with the
job-environment variables of docs/design.md, so a test can signal or `kill -9` one rank and read
each rank's own exit code. `torchrun()` runs the same script under plain torchrun.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainyard.ports import free_port

SCRIPT = Path(__file__).with_name("train_script.py")
REPO = Path(__file__).resolve().parents[2]


def base_env(out: Path, attempt: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        TRAINYARD_CHECKPOINT_DIR=str(out / "ckpt"),
        TRAINYARD_METRICS_DIR=str(out / "metrics"),
        TRAINYARD_ATTEMPT=str(attempt),
        PYTHONPATH=str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.update(extra or {})
    return env


class Ranks:
    """`nproc` rank processes of one attempt; logs in `<out>/log-a<attempt>-rank<R>.txt`."""

    def __init__(self, out: Path, nproc: int, args: list[str], attempt: int = 0,
                 env: dict[str, str] | None = None, script: Path = SCRIPT) -> None:
        self.out, self.attempt = out, attempt
        out.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.procs: list[subprocess.Popen] = []
        for r in range(nproc):
            e = base_env(out, attempt, env)
            e.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc))
            if nproc > 1:
                e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            log = open(self.log_path(r), "w")
            self.procs.append(subprocess.Popen([sys.executable, str(script), "--out", str(out), *args],
                                               stdout=log, stderr=subprocess.STDOUT, env=e, cwd=out))

    def log_path(self, rank: int) -> Path:
        return self.out / f"log-a{self.attempt}-rank{rank}.txt"

    def log(self, rank: int) -> str:
        return self.log_path(rank).read_text()

    def signal(self, rank: int, sig: int) -> None:
        self.procs[rank].send_signal(sig)

    def wait(self, timeout: float = 90) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill_all()
                logs = "\n".join(f"--- rank {r}\n{self.log(r)[-3000:]}" for r in range(len(self.procs)))
                raise AssertionError(f"ranks did not finish in {timeout} s\n{logs}") from None
        return codes

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def torchrun(out: Path, nproc: int, args: list[str], attempt: int = 0, timeout: float = 120) -> int:
    env = base_env(out, attempt)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"log-a{attempt}-torchrun.txt", "w") as log:
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                            str(SCRIPT), "--out", str(out), *args],
                           stdout=log, stderr=subprocess.STDOUT, env=env, cwd=out, timeout=timeout)
    return p.returncode


def wait_for(path: Path, procs: Ranks, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if any(p.poll() is not None for p in procs.procs) or time.monotonic() > deadline:
            procs.kill_all()
            raise AssertionError(f"{path.name} did not appear\n{procs.log(0)[-3000:]}")
        time.sleep(0.02)


def trace(out: Path, rank: int) -> list[dict]:
    """Every line rank `rank` logged, in order (all attempts)."""
    lines = (out / f"trace-rank{rank}.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if x.strip()]


def final_by_step(out: Path, rank: int) -> dict[int, dict]:
    """The last record of each step (a resumed attempt redoes steps after its checkpoint)."""
    return {rec["step"]: rec for rec in trace(out, rank)}


__all__ = ["Ranks", "final_by_step", "free_port", "signal", "torchrun", "trace", "wait_for"]
