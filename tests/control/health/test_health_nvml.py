"""The `nvml` check (control/health/nvml.py): the XID classification and the judgement of GPU
readings are pure and tested as such; the thin NVML layer (`NvmlSession`) is tested against the
real NVML where there is one, and otherwise against `FakeNvml`, an object shaped like `pynvml`
that raises pynvml's own errors (this machine has no NVIDIA driver for the real library to load).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pynvml
import pytest

from trainyard.control.health import CRITICAL, OK, WARN, run_check
from trainyard.control.health.nvml import (
    XID_WARN_HOLD_S, GpuReading, NvmlSession, XidEvent, check, classify_xid, evaluate,
)
from trainyard.spec.models import CheckSpec

SPEC = CheckSpec(name="gpus", kind="nvml", max_temp_c=85)


def _nvml_here() -> str:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return str(e)
    pynvml.nvmlShutdown()
    return ""


NO_NVML = _nvml_here()


# -- pure: classification and judgement -----------------------------------------------------------

@pytest.mark.parametrize("xid", [48, 63, 64, 74, 79, 92, 94, 95, 119, 140])
def test_hardware_xids_are_critical(xid):
    assert classify_xid(xid)[0] == CRITICAL


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68])
def test_application_xids_leave_the_gpu_healthy(xid):
    status, what = classify_xid(xid)
    assert status == OK and "application" in what


def test_an_unknown_xid_is_a_warning():
    assert classify_xid(8)[0] == WARN and classify_xid(9999)[0] == WARN


def test_healthy_gpus_are_ok():
    assert evaluate([GpuReading(0, 40.0), GpuReading(1, 41.0)], [], max_temp_c=85, since=0, now=100) == (OK, "GPUs ok")


@pytest.mark.parametrize("reading,words", [
    (GpuReading(1, 40.0, ecc_uncorrected=3), "3 uncorrectable ECC errors"),
    (GpuReading(1, 40.0, retired_pages_pending=True), "retired pages pending"),
    (GpuReading(1, 40.0, remap_pending=True), "row remapping pending"),
    (GpuReading(1, 40.0, remap_failed=True), "row remapping failed"),
    (GpuReading(1, error="GPU is lost"), "unreachable (GPU is lost)"),
])
def test_memory_faults_and_a_lost_gpu_are_critical(reading, words):
    status, msg = evaluate([GpuReading(0, 40.0), reading], [], max_temp_c=85, since=0, now=100)
    assert status == CRITICAL and msg.startswith("GPU 1: ") and words in msg


def test_heat_is_a_warning_and_the_worst_finding_comes_first():
    status, msg = evaluate([GpuReading(0, 91.0), GpuReading(1, 40.0, ecc_uncorrected=1)], [], max_temp_c=85, since=0,
                           now=100)
    assert status == CRITICAL and msg == "GPU 1: 1 uncorrectable ECC errors; GPU 0: 91 °C"
    assert evaluate([GpuReading(0, 85.0)], [], max_temp_c=85, since=0, now=100) == (WARN, "GPU 0: 85 °C")


def test_xid_events_by_class():
    gpus = [GpuReading(0, 40.0), GpuReading(1, 40.0)]
    crit = evaluate(gpus, [XidEvent(1, 79, 50.0), XidEvent(1, 79, 51.0)], max_temp_c=85, since=0, now=100)
    assert crit == (CRITICAL, "GPU 1: XID 79 (GPU has fallen off the bus) x2")
    assert evaluate(gpus, [XidEvent(0, 13, 50.0)], max_temp_c=85, since=0, now=100) == (OK, "GPUs ok")
    # an application XID is named only beside a real finding, as context
    status, msg = evaluate(gpus, [XidEvent(0, 31, 50.0), XidEvent(1, 8, 60.0)], max_temp_c=85, since=0, now=100)
    assert status == WARN and msg.startswith("GPU 1: XID 8 (") and "GPU 0: XID 31 (GPU memory page fault" in msg


def test_a_hardware_xid_stays_until_the_node_is_remediated_or_resumed_a_warning_fades():
    gpus = [GpuReading(0, 40.0)]
    events = [XidEvent(0, 48, 100.0)]
    assert evaluate(gpus, events, max_temp_c=85, since=0, now=100 + 30 * 86400)[0] == CRITICAL
    assert evaluate(gpus, events, max_temp_c=85, since=150.0, now=200)[0] == OK  # reset at 150: history
    warn = [XidEvent(0, 8, 100.0)]
    assert evaluate(gpus, warn, max_temp_c=85, since=0, now=100 + XID_WARN_HOLD_S - 1)[0] == WARN
    assert evaluate(gpus, warn, max_temp_c=85, since=0, now=100 + XID_WARN_HOLD_S + 1)[0] == OK


# -- the thin layer ------------------------------------------------------------------------------

class _EventData:
    def __init__(self, device, event_type: int, data: int):
        self.device, self.eventType, self.eventData = device, event_type, data


class FakeNvml:
    """The slice of `pynvml` NvmlSession uses, over GPUs described as dicts; errors are pynvml's."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    def __init__(self, gpus: list[dict]):
        self.gpus = gpus
        self.queue: list[_EventData] = []
        self.registered: list[int] = []
        self.calls: list[str] = []

    def _err(self, code: int) -> pynvml.NVMLError:
        return pynvml.NVMLError(code)

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if self.gpus[i].get("lost"):
            raise self._err(pynvml.NVML_ERROR_GPU_IS_LOST)
        return ("handle", i)

    def nvmlDeviceGetIndex(self, h):
        return h[1]

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self.gpus[h[1]].get("temp", 40)

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        assert (kind, counter) == (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
        if self.gpus[h[1]].get("ecc") is None:
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)  # ECC off
        return self.gpus[h[1]]["ecc"]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return int(self.gpus[h[1]].get("retired_pending", False))

    def nvmlDeviceGetRemappedRows(self, h):
        g = self.gpus[h[1]]
        return (0, 0, int(g.get("remap_pending", False)), int(g.get("remap_failed", False)))

    def nvmlEventSetCreate(self):
        return "event-set"

    def nvmlEventSetFree(self, es):
        self.calls.append("free")

    def nvmlDeviceGetSupportedEventTypes(self, h):
        return 0 if self.gpus[h[1]].get("no_events") else pynvml.nvmlEventTypeAll

    def nvmlDeviceRegisterEvents(self, h, types, es):
        assert types == pynvml.nvmlEventTypeXidCriticalError and es == "event-set"
        self.registered.append(h[1])

    def nvmlEventSetWait_v2(self, es, timeout_ms):
        assert timeout_ms == 0  # a check never waits for events to come
        if not self.queue:
            raise self._err(pynvml.NVML_ERROR_TIMEOUT)
        return self.queue.pop(0)

    def xid(self, gpu: int, xid: int) -> None:
        self.queue.append(_EventData(("handle", gpu), pynvml.nvmlEventTypeXidCriticalError, xid))


def test_the_session_registers_every_gpu_for_xid_events_and_drains_them():
    nv = FakeNvml([{"ecc": 0}, {"ecc": 0}, {"no_events": True}])
    s = NvmlSession(nv)
    assert check(SPEC, nvml=s, now=10.0) == (OK, "GPUs ok; GPU 2: no XID events")
    assert nv.registered == [0, 1] and nv.calls == ["init"]
    nv.xid(1, 79)
    nv.xid(0, 13)
    status, msg = check(SPEC, nvml=s, now=20.0)
    assert status == CRITICAL and msg.startswith("GPU 1: XID 79 (GPU has fallen off the bus)")
    assert s.xids() == [XidEvent(1, 79, 20.0), XidEvent(0, 13, 20.0)]
    assert check(SPEC, nvml=s, since=25.0, now=30.0)[0] == OK  # remediated at 25
    assert nv.calls == ["init"]  # opened once: events are only delivered to a set that stays registered
    s.close()
    assert nv.calls == ["init", "free", "shutdown"]


def test_the_session_reads_ecc_remapping_heat_and_lost_gpus():
    nv = FakeNvml([{"ecc": None, "temp": 88}, {"ecc": 2}, {"ecc": 0, "remap_pending": True}, {"lost": True}])
    status, msg = check(SPEC, nvml=NvmlSession(nv), now=1.0)
    assert status == CRITICAL
    assert msg.split("; ")[:3] == ["GPU 1: 2 uncorrectable ECC errors", "GPU 2: row remapping pending (reset to apply)",
                                   "GPU 3: unreachable (GPU is lost)"]
    assert "GPU 0: 88 °C" in msg  # ECC off on GPU 0 is no finding


def test_without_nvml_the_check_is_skipped_with_the_reason():
    class Missing:
        NVMLError = pynvml.NVMLError

        def nvmlInit(self):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    status, msg = check(SPEC, nvml=NvmlSession(Missing()))
    assert status == OK and msg.startswith("no NVML here (skipped") and "Library Not Found" in msg


@pytest.mark.skipif(bool(NO_NVML), reason=f"no NVML on this machine: {NO_NVML}")
def test_the_real_nvml():  # pragma: no cover - runs where there is an NVIDIA driver
    s = NvmlSession()
    try:
        assert s.open()
        status, msg = check(SPEC, nvml=s)
        assert status in (OK, WARN, CRITICAL) and msg
        assert len(s.readings()) == pynvml.nvmlDeviceGetCount()
        s.drain(0.0)  # nvmlEventSetWait_v2(set, 0) answers at once, with an event or a timeout
        assert run_check(SPEC, "node-0", Path(".")).status in (OK, WARN, CRITICAL)
    finally:
        s.close()


def test_a_real_pynvml_event_record_has_the_fields_the_session_reads():
    """The fake's records stand for pynvml's c_nvmlEventData_t: the fields must match."""
    names = [f[0] for f in pynvml.c_nvmlEventData_t._fields_]
    assert {"device", "eventType", "eventData"} <= set(names)
    assert ctypes.sizeof(pynvml.c_nvmlEventData_t) > 0
