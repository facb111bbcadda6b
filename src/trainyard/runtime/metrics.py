"""Step metrics: one JSON line per step in `metrics.jsonl` (rank 0), and TensorBoard if installed.

`metrics.jsonl` is the plain, greppable record the control plane and people read: each line is a
JSON object, `{"step": 12, "loss": 2.31, "lr": 0.0003, "step_time_s": 0.41, "samples_per_s": 156.1,
"samples": 384, "time": 1764500000.1, "attempt": 2, ...}`. The file is only ever appended to,
one flushed line per step, so `tail -f` works and a `kill -9` loses at most the line being written.
A resumed attempt appends `{"event": "resume", "step": N, "attempt": a, "discarded_steps": k}`
and then logs steps N+1, N+2… again: steps a previous attempt logged after its last checkpoint
appear twice, and `discarded_steps` says how many steps of work were recomputed. Readers take
the last line for each step (`read_metrics` does).

Non-finite values are written as the strings "nan", "inf", "-inf" (JSON has no such numbers).
TensorBoard (`torch.utils.tensorboard`, needs the `tensorboard` package) is optional: used
when importable unless disabled; on resume its writer purges the steps after the checkpoint.

The logger's own counters (samples and tokens seen, training time) are part of the checkpoint
(`state_dict`), so totals and averages continue across attempts.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

from trainyard.contracts import METRICS_FILE  # one definition, with the job dir's layout (re-exported)


def peak_memory() -> dict[str, float]:
    """This process's peak memory so far, for the control plane's accounting (`yard acct`'s max
    RSS and peak GPU memory): `max_rss_mib` (getrusage; Linux counts KiB) and, once CUDA is in
    use, `peak_gpu_mem_mib` (PyTorch's `max_memory_allocated` of the current device). Only what
    is cheap to read without touching the GPU: CUDA is not initialised here if it was not."""
    out: dict[str, float] = {}
    try:
        import resource

        out["max_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)
    except (ImportError, OSError, ValueError):
        pass
    import sys

    torch = sys.modules.get("torch")  # never imported for this: a job without torch has no GPU peak
    try:
        if torch is not None and torch.cuda.is_initialized():
            out["peak_gpu_mem_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    except Exception:  # noqa: BLE001 - a driver problem must not fail a progress report
        pass
    return out


def _plain(v: Any) -> Any:
    """JSON-ready value: tensors and NumPy scalars to Python numbers, non-finite floats to strings."""
    if hasattr(v, "item") and callable(v.item):
        try:
            v = v.item()
        except (ValueError, RuntimeError):  # more than one element
            return str(v)
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return f if math.isfinite(f) else str(f)


def read_metrics(path: str | Path) -> dict[int, dict[str, Any]]:
    """{step: the last line logged for that step} of a metrics.jsonl (events are skipped)."""
    p = Path(path)
    if p.is_dir():
        p = p / METRICS_FILE
    out: dict[int, dict[str, Any]] = {}
    with open(p) as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill -9
                continue
            if "event" not in rec and "step" in rec:
                out[int(rec["step"])] = rec
    return out


class MetricsLogger:
    """Per-step metrics of one job; writes only on rank 0 (other ranks just keep the counters).

    Args:
        directory: where `metrics.jsonl` (and `tensorboard/`) go; created on rank 0.
        rank: writes happen on rank 0 only.
        attempt: the attempt number recorded in every line.
        tensorboard: True = required (ImportError if missing), False = off, None = if installed.
    """

    def __init__(self, directory: str | Path, *, rank: int = 0, attempt: int = 0,
                 tensorboard: bool | None = None) -> None:
        self.directory = Path(directory)
        self.rank = rank
        self.attempt = attempt
        self.samples = 0  # global samples trained on, all attempts
        self.tokens = 0
        self.train_time_s = 0.0  # wall time spent in steps, all attempts
        self._fh: Any = None
        self._lock = threading.Lock()  # lines come from the training thread and the checkpoint thread
        self._tb: Any = None
        self._tb_mode = tensorboard
        self._purge_step: int | None = None
        # model FLOPs utilization: set by the trainer that knows its model and devices (see `set_flops`)
        self.flops_per_token: float | None = None
        self.peak_flops: float | None = None  # all ranks' devices together, FLOP/s
        self._last = time.monotonic()
        self.last_step_s = 0.0  # the wall time of the newest step (`log_step`): what phase timings split
        self._win_s, self._win_steps, self._win_samples, self._win_tokens = 0.0, 0, 0, 0
        self.last: dict[str, Any] = {}  # the last line logged (what progress reports carry)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401  (fail now, not at step 1)

    # -- writing --------------------------------------------------------------------------------

    def _file(self) -> Any:
        if self._fh is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.directory / METRICS_FILE, "a", encoding="utf-8")
        return self._fh

    def _writer(self) -> Any:
        if self._tb is None and self._tb_mode is not False:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                self._tb_mode = False
                return None
            self._tb = SummaryWriter(log_dir=str(self.directory / "tensorboard"), purge_step=self._purge_step)
        return self._tb

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (rank 0 only; a no-op elsewhere)."""
        if self.rank != 0:
            return
        line = json.dumps({k: _plain(v) for k, v in record.items()}, allow_nan=False) + "\n"
        with self._lock:
            fh = self._file()
            fh.write(line)
            fh.flush()

    def set_flops(self, flops_per_token: float | None, peak_flops: float | None) -> None:
        """Add `mfu` (model FLOPs utilization, 0-1) to the lines that have `tokens_per_s`:
        tokens/s x `flops_per_token` / `peak_flops` (the peak of every rank's device together).
        Either None: no MFU (a CPU, a GPU whose peak is not known)."""
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops

    def start_clock(self) -> None:
        """Start timing the next step now (after a resume, before the first step)."""
        self._last = time.monotonic()
        self._win_s, self._win_steps, self._win_samples, self._win_tokens = 0.0, 0, 0, 0

    def log_step(self, step: int, *, samples: int | None = None, tokens: int | None = None,
                 write: bool = True, **values: Any) -> dict[str, Any] | None:
        """Record a completed step: counters, throughput, `values`; a line when `write`.

        `samples` and `tokens` are the step's global counts (all ranks). Throughput and
        `step_time_s` are averaged over the steps since the previous line (`write=False` steps
        only count). Values may be tensors, converted with `.item()` — which waits for the GPU:
        on GPUs, write a line every few steps rather than every step.
        """
        now = time.monotonic()
        dt = max(now - self._last, 1e-9)
        self._last = now
        self.last_step_s = dt
        self.train_time_s += dt
        self._win_s += dt
        self._win_steps += 1
        if samples:
            self.samples += int(samples)
            self._win_samples += int(samples)
        if tokens:
            self.tokens += int(tokens)
            self._win_tokens += int(tokens)
        if not write:
            return None
        win = max(self._win_s, 1e-9)
        rec: dict[str, Any] = {"step": step}
        rec.update({k: _plain(v) for k, v in values.items()})
        rec["step_time_s"] = round(win / self._win_steps, 6)
        if self._win_samples:
            rec["samples_per_s"] = round(self._win_samples / win, 3)
            rec["samples"] = self.samples
        if self._win_tokens:
            rec["tokens_per_s"] = round(self._win_tokens / win, 3)
            rec["tokens"] = self.tokens
            if self.flops_per_token and self.peak_flops:
                rec["mfu"] = round(self._win_tokens / win * self.flops_per_token / self.peak_flops, 5)
        rec["time"] = round(time.time(), 3)
        rec["attempt"] = self.attempt
        self._win_s, self._win_steps, self._win_samples, self._win_tokens = 0.0, 0, 0, 0
        if self.rank == 0:
            self.write(rec)
            tb = self._writer()
            if tb is not None:
                for k, v in rec.items():
                    if k not in ("step", "time", "attempt") and isinstance(v, (int, float)) and not isinstance(v, bool):
                        tb.add_scalar(k, v, step)
        self.last = rec
        return rec

    def event(self, name: str, step: int, **fields: Any) -> None:
        """A non-step line: `{"event": name, "step": step, "time": …, "attempt": …, **fields}`."""
        self.write({"event": name, "step": step, "time": round(time.time(), 3), "attempt": self.attempt, **fields})

    def resumed(self, step: int, logged_through: int | None = None) -> None:
        """Note a resume at `step` (call after loading the checkpoint's counters)."""
        self._purge_step = step + 1
        if self.rank == 0:
            last = logged_through if logged_through is not None else self._last_logged_step()
            self.event("resume", step, discarded_steps=max(0, (last or 0) - step))

    def _last_logged_step(self) -> int | None:
        p = self.directory / METRICS_FILE
        if not p.exists():
            return None
        with open(p, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            lines = fh.read().decode("utf-8", "replace").splitlines()
        for line in reversed(lines):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "event" not in rec and "step" in rec:
                return int(rec["step"])
        return None

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    # -- checkpointing --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "tokens": self.tokens, "train_time_s": self.train_time_s}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.samples = int(state.get("samples", 0))
        self.tokens = int(state.get("tokens", 0))
        self.train_time_s = float(state.get("train_time_s", 0.0))
