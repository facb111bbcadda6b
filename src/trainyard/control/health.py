"""Node health checks (issue 7): configured checks run on every node on a schedule, in a thread
of their own so a slow check never stalls the control loop; their newest results decide whether
a node may take work.

A result is OK, WARN or CRITICAL with a message, as LBNL NHC and Meta's GCM report them. The loop
(`ControlLoop.watch_nodes`) takes a node with a CRITICAL result down — nothing new lands there,
its jobs checkpoint-stop and resume elsewhere — and returns it once a fresh round of its checks
passes. WARN is shown (`yard nodes`, events) but keeps the node in service.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from trainyard.spec import ActionSpec, CheckSpec, HealthSpec, RemediationSpec

OK, WARN, CRITICAL = "ok", "warn", "critical"
RANK = {OK: 0, WARN: 1, CRITICAL: 2}


@dataclass(frozen=True)
class CheckResult:
    check: str
    status: str  # ok, warn, critical
    message: str
    at: float


def run_check(spec: CheckSpec, node: str, data_dir: Path) -> CheckResult:
    """One check on one node, now. Never raises: a check that cannot run is CRITICAL."""
    now = time.time()
    try:
        if spec.kind == "command":
            status, msg = _command(spec, node, data_dir)
        elif spec.kind == "disk":
            status, msg = _disk(spec, node, data_dir)
        else:
            status, msg = _nvml(spec)
    except Exception as e:  # noqa: BLE001 - the check's failure is itself the finding
        status, msg = CRITICAL, f"check could not run: {e}"
    return CheckResult(spec.name, status, msg[:300], now)


def _command(spec: CheckSpec, node: str, data_dir: Path) -> tuple[str, str]:
    env = {**os.environ, "TRAINYARD_NODE": node, "TRAINYARD_DATA_DIR": str(data_dir)}
    try:
        r = subprocess.run(spec.command or [], env=env, capture_output=True, text=True, timeout=spec.timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return CRITICAL, f"timed out after {spec.timeout:g}s"
    except OSError as e:
        return CRITICAL, f"cannot run {spec.command[0] if spec.command else '?'}: {e.strerror}"
    first = (r.stdout.strip() or r.stderr.strip()).splitlines()[:1]
    msg = first[0] if first else f"exit {r.returncode}"
    return {0: OK, 1: WARN, 2: CRITICAL}.get(r.returncode, CRITICAL), msg


def _disk(spec: CheckSpec, node: str, data_dir: Path) -> tuple[str, str]:
    worst, msgs = OK, []
    for template in spec.paths:
        path = Path(template.format(node=node, data_dir=data_dir))
        if not path.exists():
            continue  # a checkpoint dir not made yet is not a problem
        free_gb = shutil.disk_usage(path).free / 2**30
        status = CRITICAL if free_gb < spec.critical_free_gb else WARN if free_gb < spec.warn_free_gb else OK
        if RANK[status] > RANK[worst]:
            worst = status
        if status != OK:
            msgs.append(f"{path}: {free_gb:.2f} GB free")
    return worst, "; ".join(msgs) or "free space ok"


def _nvml(spec: CheckSpec) -> tuple[str, str]:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001
        return OK, "no NVML here (skipped)"
    try:
        worst, msgs = OK, []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                ecc = pynvml.nvmlDeviceGetTotalEccErrors(h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                         pynvml.NVML_VOLATILE_ECC)
            except pynvml.NVMLError:
                ecc = 0
            try:
                pending = pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h)
            except pynvml.NVMLError:
                pending = 0
            temp = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
            if ecc or pending:
                worst = CRITICAL
                msgs.append(f"GPU {i}: {ecc} uncorrectable ECC errors" + (", retired pages pending" if pending else ""))
            elif temp >= spec.max_temp_c:
                worst = max(worst, WARN, key=RANK.get)
                msgs.append(f"GPU {i}: {temp} °C")
        return worst, "; ".join(msgs) or "GPUs ok"
    finally:
        pynvml.nvmlShutdown()


class HealthChecker:
    """Runs the configured checks on every node every `interval`, in a background thread.

    `results(node)` gives the newest result of each check; `run_now(node)` runs them at once
    (the loop calls it before a node returns to service).
    """

    def __init__(self, data_dir: Path, spec_of: Callable[[], HealthSpec], nodes_of: Callable[[], list[str]]):
        self.data_dir = data_dir
        self.spec_of = spec_of
        self.nodes_of = nodes_of
        self._results: dict[str, dict[str, CheckResult]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trainyard-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            spec = self.spec_of()
            if spec.checks:
                for node in self.nodes_of():
                    self.run_now(node, spec)
            self._stop.wait(max(0.2, spec.interval))

    def run_now(self, node: str, spec: HealthSpec | None = None) -> list[CheckResult]:
        spec = spec or self.spec_of()
        out = [run_check(c, node, self.data_dir) for c in spec.checks]
        with self._lock:
            self._results[node] = {r.check: r for r in out}
        return out

    def results(self, node: str) -> list[CheckResult]:
        with self._lock:
            return list(self._results.get(node, {}).values())


def worst(results: list[CheckResult]) -> CheckResult | None:
    """The most severe non-OK result, if any."""
    bad = [r for r in results if r.status != OK]
    return max(bad, key=lambda r: RANK[r.status]) if bad else None


@dataclass
class _Round:
    attempts: int = 0  # remediation rounds started since the node last went down
    running: bool = False
    last_end: float | None = None
    finished: list[tuple[str, bool, str]] | None = None  # (action, ok, message) of a round not yet reported
    alerted: bool = False


class Remediator:
    """Runs a node's remediation actions (reboot, reimage, …) in a thread per round.

    The control loop decides when (`may_start`: not running, rounds left, cooldown over) and
    reads the outcome (`take_finished`); the node's state and events are the loop's. Rounds are
    counted in memory: a control plane restart gives a down node its attempts again.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._nodes: dict[str, _Round] = {}
        self._lock = threading.Lock()

    def state(self, node: str) -> _Round:
        with self._lock:
            return self._nodes.setdefault(node, _Round())

    def may_start(self, node: str, spec: RemediationSpec, now: float) -> bool:
        r = self.state(node)
        if r.running or r.attempts >= spec.max_attempts:
            return False
        return r.last_end is None or now - r.last_end >= spec.cooldown

    def exhausted(self, node: str, spec: RemediationSpec) -> bool:
        r = self.state(node)
        return not r.running and r.attempts >= spec.max_attempts

    def start(self, node: str, spec: RemediationSpec) -> int:
        """Start a round in the background; returns its number (1, 2, …)."""
        r = self.state(node)
        r.attempts += 1
        r.running = True
        threading.Thread(target=self._round, args=(node, list(spec.actions), r), name=f"trainyard-remedy-{node}",
                         daemon=True).start()
        return r.attempts

    def _round(self, node: str, actions: list[ActionSpec], r: _Round) -> None:
        out: list[tuple[str, bool, str]] = []
        env = {**os.environ, "TRAINYARD_NODE": node, "TRAINYARD_DATA_DIR": str(self.data_dir)}
        for a in actions:
            try:
                p = subprocess.run(a.command, env=env, capture_output=True, text=True, timeout=a.timeout,
                                   stdin=subprocess.DEVNULL)
                first = (p.stdout.strip() or p.stderr.strip()).splitlines()[:1]
                out.append((a.name, p.returncode == 0, first[0][:200] if first else f"exit {p.returncode}"))
            except subprocess.TimeoutExpired:
                out.append((a.name, False, f"timed out after {a.timeout:g}s"))
            except OSError as e:
                out.append((a.name, False, f"cannot run {a.command[0]}: {e.strerror}"))
            if not out[-1][1]:
                break  # the next action assumes this one worked
        with self._lock:
            r.running, r.last_end, r.finished = False, time.time(), out

    def take_finished(self, node: str) -> list[tuple[str, bool, str]] | None:
        with self._lock:
            r = self._nodes.get(node)
            if r is None or r.finished is None:
                return None
            done, r.finished = r.finished, None
            return done

    def reset(self, node: str) -> None:
        """The node is back in service (or an operator took it over): its rounds start afresh."""
        with self._lock:
            r = self._nodes.get(node)
            if r is not None and not r.running:
                del self._nodes[node]
