"""How busy this machine's GPUs are, by NVML: the GPU part of "is this allocation idle" (issue 38;
`LocalBackend.gpu_percent`, read by control/loop/idle.py), and each GPU's full reading for the node
agent (`read`: utilization, memory, power, temperature; backends/local/gpu_agent.py, issue 39).

NVML's utilization rate is the share of its last sample period (1/6 s to 1 s, by GPU) in which
a kernel ran on the GPU. It is a fact about the whole GPU, which an allocation holds alone. NVML
is initialised once per process, on first use, and kept open (an init costs tens of ms); a machine
without it (no library, no driver) is asked once and answers None from then on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

_lock = threading.Lock()
_nvml: Any = None  # the pynvml module once initialised
_absent = False


def _lib() -> Any:
    global _nvml, _absent
    with _lock:
        if _nvml is None and not _absent:
            try:
                import pynvml

                pynvml.nvmlInit()
                _nvml = pynvml
            except Exception:  # noqa: BLE001 - no library, no driver: no NVML here
                _absent = True
        return _nvml


def busiest(indices: Sequence[int], lib: Any = None) -> float | None:
    """The highest utilization (percent) among the GPUs of these NVML indices; None without NVML
    or when none of them can be read. `lib`: a pynvml-shaped object (tests)."""
    nv = lib if lib is not None else _lib()
    if nv is None:
        return None
    best: float | None = None
    for i in indices:
        try:
            rate = nv.nvmlDeviceGetUtilizationRates(nv.nvmlDeviceGetHandleByIndex(i))
        except Exception:  # noqa: BLE001 - NVMLError: this GPU cannot say (MIG, lost); others may
            continue
        best = max(best or 0.0, float(rate.gpu))
    return best


def nvml() -> Any:
    """The initialised pynvml module, or None where NVML is absent (asked once per process)."""
    return _lib()


@dataclass(frozen=True)
class Reading:
    """One GPU by NVML: utilization percent, memory in use (MiB), power (W), temperature (°C);
    power or temperature None where that GPU does not report it."""

    util: float
    mem_mib: float
    power_w: float | None
    temp_c: float | None


def read(index: int, nv: Any) -> Reading | None:
    """NVML's reading of GPU `index` through `nv` (pynvml, or a pynvml-shaped object in tests):
    `nvmlDeviceGetUtilizationRates`, `MemoryInfo`, `PowerUsage` (mW) and `Temperature` (the GPU
    die's); None when the GPU cannot say (NVMLError: lost, MIG parent)."""
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)
        util = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
        mem = float(nv.nvmlDeviceGetMemoryInfo(h).used) / 2**20
    except Exception:  # noqa: BLE001 - NVMLError: this GPU cannot say
        return None
    return Reading(util, mem, _optional(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
                   _optional(lambda: nv.nvmlDeviceGetTemperature(h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))))


def _optional(get: Callable[[], Any]) -> float | None:
    try:
        return float(get())
    except Exception:  # noqa: BLE001 - NVML_ERROR_NOT_SUPPORTED on some boards
        return None
