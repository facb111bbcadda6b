"""The `nvml` built-in check: a node's GPUs as NVML sees them, and the XID events it reports.

Two layers, so that the judgement is testable without a GPU:

- **pure**: `classify_xid` and `evaluate` turn readings (`GpuReading`) and XID events
  (`XidEvent`) into OK/WARN/CRITICAL and a message;
- **thin**: `NvmlSession` is the only code that calls NVML (through `pynvml`, or any object
  shaped like it). It initialises NVML once per process and keeps it open, because an NVML event
  set only delivers events that happen while it is registered: it creates one event set,
  registers every GPU for `nvmlEventTypeXidCriticalError`, and each check drains it with
  `nvmlEventSetWait_v2(set, 0)` (no waiting) into a bounded in-memory log.

**How XIDs count.** An XID is the driver's report of a GPU error. Sources for the classes below:

- NVIDIA, *Xid Errors* and the Xid catalog (https://docs.nvidia.com/deploy/xid-errors/,
  "Resolution Bucket (Immediate Action)"): 48 double-bit ECC, 63/64 page retirement or row
  remapping recorded/failed, 74 NVLink, 79 fallen off the bus, 92 high single-bit ECC rate,
  94/95 contained/uncontained ECC, 119/120 GSP, 140 unrecovered ECC and 62 micro-controller halt
  call for a GPU reset, a reboot or a replacement;
- NVIDIA, *Dynamic Page Retirement* (https://docs.nvidia.com/deploy/dynamic-page-retirement/):
  48 DBE, 63 page retired (reload to activate), 64 page retirement failed;
- NVIDIA k8s-device-plugin, `internal/rm/health.go`: 13, 31, 43, 45 and 68 are "application
  errors: the GPU should still be healthy" — an illegal address in a user's kernel is no reason
  to take a node out;
- Meta's GCM (`health_checks check-syslogs xid`): critical XIDs → CRITICAL, other XIDs → WARN.

So: application XIDs are OK (named in the message only while other findings are shown),
hardware XIDs are CRITICAL and stay so until the node is remediated or resumed (`since`: the
GPU needs a reset, which the event log cannot see), any other XID is WARN for
`XID_WARN_HOLD_S` after it was seen (a person should look; the node takes no new work meanwhile).

The other readings: uncorrectable ECC errors (volatile count), retired pages pending, row
remapping pending or failed, and a GPU NVML cannot reach are CRITICAL — each clears with a GPU
reset, which is what remediation is for; temperature at or above `max_temp_c` is WARN.

Limits: an event's time is when a check drained it (NVML's event data carries no time), and
events from before the control plane started are not delivered (the kernel log holds them).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable

from trainyard.control.health.checks import CRITICAL, OK, RANK, WARN, worse
from trainyard.spec.models import CheckSpec

APPLICATION_XIDS = {
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "preemptive cleanup after earlier errors", 68: "video processor exception",
}
HARDWARE_XIDS = {
    48: "double-bit ECC error", 62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded; reset to apply", 64: "page retirement or row remapping failed",
    74: "NVLink error", 79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error",
    140: "unrecovered ECC error",
}
XID_WARN_HOLD_S = 600.0  # an XID of unknown weight keeps the node suspect this long after it was seen
MAX_XIDS = 1000  # events remembered per process


def classify_xid(xid: int) -> tuple[str, str]:
    """(status, what it is) for one XID; see the module docstring for the sources."""
    if xid in APPLICATION_XIDS:
        return OK, f"{APPLICATION_XIDS[xid]}, an application error"
    if xid in HARDWARE_XIDS:
        return CRITICAL, HARDWARE_XIDS[xid]
    return WARN, "not a known application or hardware XID"


@dataclass(frozen=True)
class GpuReading:
    index: int
    temp_c: float | None = None
    ecc_uncorrected: int = 0  # volatile: since the last driver load or GPU reset
    retired_pages_pending: bool = False
    remap_pending: bool = False
    remap_failed: bool = False
    error: str | None = None  # NVML could not reach this GPU at all


@dataclass(frozen=True)
class XidEvent:
    gpu: int  # index, -1 when NVML could not say which
    xid: int
    at: float


def evaluate(readings: Iterable[GpuReading], xids: Iterable[XidEvent], *, max_temp_c: float, since: float,
             now: float, notes: Iterable[str] = ()) -> tuple[str, str]:
    """The node's status and message from its GPUs' readings and XID events. Pure.

    XIDs seen before `since` (the node was remediated or resumed since) are forgotten; a WARN
    XID is forgotten `XID_WARN_HOLD_S` after it was seen.
    """
    found: list[tuple[str, str]] = []
    for r in readings:
        if r.error is not None:
            found.append((CRITICAL, f"GPU {r.index}: unreachable ({r.error})"))
            continue
        bad = ([f"{r.ecc_uncorrected} uncorrectable ECC errors"] if r.ecc_uncorrected else []) \
            + (["retired pages pending"] if r.retired_pages_pending else []) \
            + (["row remapping pending (reset to apply)"] if r.remap_pending else []) \
            + (["row remapping failed"] if r.remap_failed else [])
        if bad:
            found.append((CRITICAL, f"GPU {r.index}: {', '.join(bad)}"))
        if r.temp_c is not None and r.temp_c >= max_temp_c:
            found.append((WARN, f"GPU {r.index}: {r.temp_c:g} °C"))
    seen: dict[tuple[int, int], int] = {}
    for e in xids:
        if e.at < since:
            continue
        status, _ = classify_xid(e.xid)
        if status == WARN and now - e.at > XID_WARN_HOLD_S:
            continue
        seen[(e.gpu, e.xid)] = seen.get((e.gpu, e.xid), 0) + 1
    app: list[str] = []
    for (gpu, xid), n in sorted(seen.items()):
        status, what = classify_xid(xid)
        text = f"GPU {gpu if gpu >= 0 else '?'}: XID {xid} ({what})" + (f" x{n}" if n > 1 else "")
        if status == OK:
            app.append(text)
        else:
            found.append((status, text))
    status = OK
    for s, _ in found:
        status = worse(status, s)
    found.sort(key=lambda f: -RANK[f[0]])  # the message is cut at 300 characters: the worst first
    msgs = ([m for _, m in found] + app) if found else ["GPUs ok"]
    return status, "; ".join(msgs + list(notes))


class NvmlSession:
    """NVML, opened once for this process, with an XID event set (the thin layer).

    `lib` is the `pynvml` module (imported on first use) or an object shaped like it. Safe to
    call from several threads: NVML is, and the session's state is under a lock.
    """

    def __init__(self, lib: Any = None) -> None:
        self._lib = lib
        self._lock = threading.Lock()
        self._open = False
        self._events: Any = None
        self._xids: deque[XidEvent] = deque(maxlen=MAX_XIDS)
        self.notes: list[str] = []  # what the session could not do (no XID events on this GPU, …)
        self.unavailable = ""

    def open(self) -> bool:
        """NVML initialised (now or before), with every GPU registered for XID events when it can be.
        False (and `unavailable` says why) when there is no NVML here; tried again on the next call."""
        with self._lock:
            if self._open:
                return True
            try:
                if self._lib is None:
                    import pynvml

                    self._lib = pynvml
                self._lib.nvmlInit()
            except Exception as e:  # noqa: BLE001 - no library, no driver: no NVML here
                self.unavailable = str(e) or type(e).__name__
                return False
            self._open = True
            self._register()
            return True

    def _register(self) -> None:
        nv = self._lib
        xid = nv.nvmlEventTypeXidCriticalError
        try:
            events = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            self.notes = [f"no XID events: {e}"]
            return
        notes, registered = [], 0
        for i in range(nv.nvmlDeviceGetCount()):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                if not nv.nvmlDeviceGetSupportedEventTypes(h) & xid:
                    notes.append(f"GPU {i}: no XID events")
                    continue
                nv.nvmlDeviceRegisterEvents(h, xid, events)
                registered += 1
            except nv.NVMLError as e:
                notes.append(f"GPU {i}: no XID events ({e})")
        self.notes = notes
        if registered:
            self._events = events
        else:
            nv.nvmlEventSetFree(events)

    def drain(self, now: float) -> None:
        """Move the XID events NVML holds into the log, without waiting for more."""
        nv = self._lib
        with self._lock:
            if self._events is None:
                return
            for _ in range(MAX_XIDS):
                try:
                    data = nv.nvmlEventSetWait_v2(self._events, 0)
                except nv.NVMLError as e:
                    if getattr(e, "value", None) != nv.NVML_ERROR_TIMEOUT:  # the timeout means: none left
                        self.notes = [*self.notes[-4:], f"XID events: {e}"]
                    return
                if not data.eventType & nv.nvmlEventTypeXidCriticalError:
                    continue
                try:
                    gpu = int(nv.nvmlDeviceGetIndex(data.device))
                except nv.NVMLError:
                    gpu = -1
                self._xids.append(XidEvent(gpu, int(data.eventData), now))

    def xids(self) -> list[XidEvent]:
        with self._lock:
            return list(self._xids)

    def readings(self) -> list[GpuReading]:
        nv = self._lib
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                temp = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
            except nv.NVMLError as e:
                out.append(GpuReading(i, error=str(e)))
                continue
            ecc = _optional(lambda: nv.nvmlDeviceGetTotalEccErrors(  # noqa: B023 - called at once
                h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC), nv, 0)
            pending = _optional(lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(h), nv, 0)  # noqa: B023
            remap = _optional(lambda: nv.nvmlDeviceGetRemappedRows(h), nv, (0, 0, 0, 0))  # noqa: B023
            out.append(GpuReading(i, float(temp), int(ecc), bool(pending), bool(remap[2]), bool(remap[3])))
        return out

    def close(self) -> None:
        with self._lock:
            if not self._open:
                return
            if self._events is not None:
                self._lib.nvmlEventSetFree(self._events)
                self._events = None
            self._lib.nvmlShutdown()
            self._open = False


def _optional(read, nv: Any, default: Any) -> Any:  # noqa: ANN001
    """A reading some GPUs do not support (ECC off, no row remapper before Ampere): the default."""
    try:
        return read()
    except nv.NVMLError:
        return default


_session: NvmlSession | None = None
_session_lock = threading.Lock()


def session() -> NvmlSession:
    """The process's NVML session, made on first use."""
    global _session
    with _session_lock:
        if _session is None:
            _session = NvmlSession()
        return _session


def check(spec: CheckSpec, *, since: float = 0.0, now: float | None = None,
          nvml: NvmlSession | None = None) -> tuple[str, str]:
    """The `nvml` check: OK "no NVML here" without NVML, else `evaluate` on fresh readings."""
    now = time.time() if now is None else now
    s = nvml or session()
    if not s.open():  # plane's own: an NVML session, no file
        return OK, f"no NVML here (skipped: {s.unavailable})"
    s.drain(now)
    return evaluate(s.readings(), s.xids(), max_temp_c=spec.max_temp_c, since=since, now=now, notes=s.notes)
