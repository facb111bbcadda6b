"""The local launcher behind `yard run`: N ranks on this machine, signals forwarded, one exit code.

    launch("llama-pretrain", ["steps=24"], nproc=2, out=Path("runs/llama"))

Why not torchrun: its agent dies of SIGUSR1's default action and reports 1 instead of the ranks'
75 (docs/runtime.md), and it restarts or tears down ranks by its own rules. Here the launcher is
what trainyard's local backend is to a job, minus the control plane:

1. every rank is `python -m trainyard.recipes RECIPE --set …` with the contract environment:
   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT,
   TRAINYARD_CHECKPOINT_DIR=OUT/checkpoints, TRAINYARD_METRICS_DIR=OUT/metrics,
   TRAINYARD_ATTEMPT (1, 2, … per launch into the same OUT), OMP_NUM_THREADS = cores / N unless
   set, and HF_HUB_OFFLINE=1 (nothing is downloaded at run time);
2. the ranks are children in a process group of their own, so a Ctrl-C in the terminal reaches
   the launcher only, which turns it into the preemption notice (checkpoint, exit 75; a second
   Ctrl-C kills). SIGUSR1 and SIGTERM to the launcher are forwarded to every rank. Each rank gets
   SIGTERM (= checkpoint and stop) if the launcher itself dies (PR_SET_PDEATHSIG);
3. each rank's output goes to OUT/logs/rank-<R>.log (appended, a line marks each attempt) and is
   echoed here, prefixed `[rank R]` when N > 1;
4. when a rank fails, the others get `fail_grace_s` to notice (their next collective fails) and
   are then killed, as a job's ranks are;
5. the exit code: 0 when every rank finished; 75 when they stopped on a notice (checkpointed);
   else that of a rank killed from outside (128 + N for signal N), else the first failure's.

Running the same command again with the same OUT resumes from the newest complete checkpoint:
the runtime finds it under OUT/checkpoints.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from trainyard.contracts import NOTICE_SIGNAL, PREEMPT_SIGNALS, REQUEUE_EXIT, JobDir
from trainyard.ports import free_port

RUN_FILE = "run.json"
HANDLED = (*PREEMPT_SIGNALS, signal.SIGINT)


def _child_setup() -> None:  # runs in the child between fork and exec
    # the launcher blocks the forwarded signals while it starts the ranks; the mask is inherited
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG: SIGTERM when the launcher dies
    except Exception:  # noqa: BLE001 - not Linux: ranks outlive a killed launcher
        pass


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def rank_command(recipe: str, sets: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "trainyard.recipes", recipe]
    for s in sets:
        cmd += ["--set", s]
    return cmd


class _Tail(threading.Thread):
    """Echo the ranks' log files as they grow (complete lines; the rest at the end)."""

    def __init__(self, files: list[Path], prefix: bool, sink: TextIO) -> None:
        super().__init__(daemon=True)
        self.files = files
        self.offsets = [f.stat().st_size if f.exists() else 0 for f in files]
        self.prefix = prefix
        self.sink = sink
        self.stop = threading.Event()

    def pump(self, final: bool = False) -> None:
        for r, f in enumerate(self.files):
            try:
                with open(f, "rb") as fh:
                    fh.seek(self.offsets[r])
                    chunk = fh.read()
            except OSError:
                continue
            if not final:
                cut = chunk.rfind(b"\n") + 1
                chunk = chunk[:cut]
            if not chunk:
                continue
            self.offsets[r] += len(chunk)
            text = chunk.decode("utf-8", errors="replace")
            if self.prefix:
                text = "".join(f"[rank {r}] {line}" for line in text.splitlines(keepends=True))
            if not text.endswith("\n"):
                text += "\n"
            try:
                self.sink.write(text)
                self.sink.flush()
            except (OSError, ValueError):
                pass

    def run(self) -> None:
        while not self.stop.wait(0.1):
            self.pump()


class Launcher:
    """N local ranks of one recipe; `run()` returns the exit code (see the module docstring)."""

    def __init__(self, recipe: str, sets: list[str], nproc: int, out: Path, *, fail_grace_s: float = 10.0,
                 echo: TextIO | None = sys.stderr) -> None:
        self.recipe, self.sets, self.nproc = recipe, list(sets), nproc
        self.out = Path(out).resolve()
        self.fail_grace_s = fail_grace_s
        self.echo = echo
        self.procs: list[subprocess.Popen] = []
        self.interrupts = 0

    # -- signals ---------------------------------------------------------------------------------------

    def _forward(self, sig: int) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass

    def _on_signal(self, signum: int, frame: object) -> None:
        sig = signum
        if signum == signal.SIGINT:
            self.interrupts += 1
            if self.interrupts > 1:
                self._note("second interrupt: killing the ranks")
                sig = signal.SIGKILL
            else:
                self._note("interrupt: the ranks checkpoint at the next step and stop (exit 75); "
                           "interrupt again to kill them")
                sig = NOTICE_SIGNAL
        self._forward(sig)

    def _note(self, msg: str) -> None:
        try:
            os.write(2, f"yard run: {msg}\n".encode())
        except OSError:
            pass

    # -- the run ---------------------------------------------------------------------------------------

    def _attempt(self) -> int:
        try:
            prev = json.loads((self.out / RUN_FILE).read_text()).get("attempt", 0)
        except (OSError, ValueError, AttributeError):
            prev = 0
        return int(prev) + 1

    def _write_run_file(self, attempt: int, port: int) -> None:
        info = {"attempt": attempt, "recipe": self.recipe, "sets": self.sets, "nproc": self.nproc, "port": port,
                "pids": [p.pid for p in self.procs], "launcher_pid": os.getpid(), "time": time.time()}
        tmp = self.out / f".{RUN_FILE}.tmp"
        tmp.write_text(json.dumps(info, indent=1))
        os.replace(tmp, self.out / RUN_FILE)

    def _env(self, rank: int, port: int, attempt: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("TRAINYARD_") or k == "TRAINYARD_WATCHDOG_S"}
        if "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // self.nproc))
        env.update(
            RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(self.nproc), LOCAL_WORLD_SIZE=str(self.nproc),
            TRAINYARD_CHECKPOINT_DIR=str(JobDir(self.out).checkpoints),
            TRAINYARD_METRICS_DIR=str(JobDir(self.out).metrics_dir),
            TRAINYARD_ATTEMPT=str(attempt), PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
        )
        if self.nproc > 1:
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        else:
            env.pop("MASTER_ADDR", None)
            env.pop("MASTER_PORT", None)
        return env

    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        logs = JobDir(self.out).logs
        logs.mkdir(exist_ok=True)
        attempt = self._attempt()
        port = free_port()
        previous = {s: signal.signal(s, self._on_signal) for s in HANDLED}
        files = [JobDir(self.out).rank_log(r) for r in range(self.nproc)]
        tail = None
        try:
            if self.echo is not None:
                tail = _Tail(files, self.nproc > 1, self.echo)
            cmd = rank_command(self.recipe, self.sets)
            # a signal during the start is held until every rank exists, then goes to all of them
            signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
            try:
                self._start(cmd, files, port, attempt)
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
            self._write_run_file(attempt, port)
            if tail is not None:
                tail.start()
            code, summary = self._wait()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            if tail is not None:
                tail.stop.set()
                if tail.is_alive():
                    tail.join()
                tail.pump(final=True)
        if summary:
            self._note(summary)
        return code

    def _start(self, cmd: list[str], files: list[Path], port: int, attempt: int) -> None:
        try:
            for r in range(self.nproc):
                with open(files[r], "a") as fh:
                    fh.write(f"=== yard run: attempt {attempt}, rank {r} of {self.nproc}, "
                             f"{time.strftime('%Y-%m-%dT%H:%M:%S')}: {' '.join(cmd[2:])}\n")
                    fh.flush()
                    self.procs.append(subprocess.Popen(
                        cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                        env=self._env(r, port, attempt), process_group=0, preexec_fn=_child_setup))
        except BaseException:
            self._forward(signal.SIGKILL)  # every rank or none
            for p in self.procs:
                p.wait()
            raise

    def _wait(self) -> tuple[int, str]:
        """Wait for every rank; (exit code, a summary line)."""
        first_failure: tuple[int, int] | None = None  # (rank, code)
        failed_at: float | None = None
        forwarded_kill = False
        codes: dict[int, int] = {}
        while len(codes) < len(self.procs):
            for r, p in enumerate(self.procs):
                if r in codes or p.poll() is None:
                    continue
                codes[r] = exit_code(p.returncode)
                if codes[r] not in (0, REQUEUE_EXIT) and first_failure is None:
                    first_failure, failed_at = (r, codes[r]), time.monotonic()
                    how = (f"was killed by {signal.Signals(-p.returncode).name}" if p.returncode < 0
                           else f"exited {codes[r]}")
                    self._note(f"rank {r} {how}; the other ranks get {self.fail_grace_s:g} s to stop")
            if failed_at is not None and time.monotonic() - failed_at > self.fail_grace_s:
                self._forward(signal.SIGKILL)
                failed_at, forwarded_kill = float("inf"), True
            if len(codes) < len(self.procs):
                time.sleep(0.05)
        if first_failure is not None:
            # A rank killed from outside is the cause, whichever exit was seen first: its peers then
            # fail on their own (a collective breaks: exit 1). Signals this launcher forwarded don't count.
            killed = [r for r in sorted(codes) if codes[r] > 128 and not (forwarded_kill and r != first_failure[0])]
            code = codes[killed[0]] if killed else first_failure[1]
            cause = ""
            if killed:
                name = signal.Signals(codes[killed[0]] - 128).name if codes[killed[0]] - 128 in signal.valid_signals() \
                    else f"signal {codes[killed[0]] - 128}"
                cause = f"; rank {killed[0]} was killed by {name}"
            return code, f"failed: exit codes by rank {[codes[r] for r in range(len(self.procs))]}{cause}"
        if any(c == REQUEUE_EXIT for c in codes.values()):
            return REQUEUE_EXIT, (f"preempted: the ranks checkpointed and stopped (exit {REQUEUE_EXIT}); "
                                  "run the same command again to resume")
        return 0, ""


def launch(recipe: str, sets: list[str], nproc: int, out: Path, **kw: object) -> int:
    return Launcher(recipe, sets, nproc, out, **kw).run()  # type: ignore[arg-type]


__all__ = ["Launcher", "exit_code", "free_port", "launch", "rank_command"]
