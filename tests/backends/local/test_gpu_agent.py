"""The local backend's node agent (`backends/local/gpu_agent.py`, `LocalBackend.gpu_readings`, issue 39):
emulated GPUs read from their ranks' real CPU activity, NVML's readings where a node's GPUs answer.

The emulation runs real ranks on this machine (each containment it has); NVML is not on this machine,
so its path runs against a pynvml-shaped object (the NVML read itself runs in bench/gpu_check.sh
where a GPU is lent).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from tests.accounts import ROOT_ONLY, shared_dir
from tests.backends.helpers import local_backend, make_spec
from trainyard.backends import LocalBackend
from trainyard.backends.base import GpuReading, NodeInfo
from trainyard.backends.local import gpu_agent
from trainyard.backends.local.gpu_agent import Holder, NodeAgent

pytestmark = ROOT_ONLY

BUSY = ["sh", "-c", "while :; do :; done"]
# 64 MiB resident: python holding a filled bytearray
HOLDS_MEMORY = ["python3", "-c", "import time; b = bytearray(64 * 2**20); b[::4096] = b'x' * (len(b) // 4096); "
                "time.sleep(300)"]


@pytest.fixture(params=["auto", "subreaper"])
def backend(request: pytest.FixtureRequest) -> Iterator[LocalBackend]:
    with shared_dir("tyagent-") as place, local_backend(place / "data", request.param) as be:
        yield be


def by_gpu(readings: list[GpuReading]) -> dict[tuple[str, int], GpuReading]:
    return {(r.node, r.gpu): r for r in readings}


def test_a_busy_ranks_gpu_reads_busy_and_a_sleeping_ranks_idle(backend):
    data = backend._data_dir
    backend.launch(make_spec(data, 1, BUSY, ranks=((0, "node0", (2,)),)))
    backend.launch(make_spec(data, 2, HOLDS_MEMORY, ranks=((0, "node1", (0, 1)),)))
    time.sleep(0.5)
    assert backend.gpu_readings() == []  # first sight: no rate yet
    time.sleep(1.0)
    got = by_gpu(backend.gpu_readings())
    assert set(got) == {("node0", 2), ("node1", 0), ("node1", 1)}  # the held GPUs only
    busy, idle = got[("node0", 2)], got[("node1", 0)]
    assert {r.source for r in got.values()} == {"emulated"}
    # a busy loop on a machine of 2 cores shared with other work (load 8 seen): well above idle, at most 100
    assert 20 <= busy.util <= 100, busy
    assert idle.util < 5, idle
    assert busy.power_w is not None and idle.power_w is not None and busy.power_w > idle.power_w >= gpu_agent.IDLE_W
    assert busy.temp_c is not None and idle.temp_c is not None and busy.temp_c > idle.temp_c
    # the sleeper's 64 MiB, shared by its two GPUs
    assert 30 <= idle.mem_mib <= 16384 and got[("node1", 1)].mem_mib == idle.mem_mib, idle
    backend.release(1, 1)
    time.sleep(0.3)
    assert ("node0", 2) not in by_gpu(backend.gpu_readings())  # released: no holder, no reading


class FakeNvml:
    """GPU i reads `gpus[i]` = (util, used MiB, mW, °C); an index not in it raises, as NVML does."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, gpus: dict[int, tuple[int, int, int, int]]):
        self.gpus = gpus

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802 - NVML's names
        if i not in self.gpus:
            raise RuntimeError(f"NVML: no GPU {i}")
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(gpu=self.gpus[h][0], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(used=self.gpus[h][1] * 2**20, total=81559 * 2**20)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:  # noqa: N802
        return self.gpus[h][2]

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:  # noqa: N802
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self.gpus[h][3]


class NoPowerSensor(FakeNvml):
    def nvmlDeviceGetPowerUsage(self, h: int) -> int:  # noqa: N802
        raise RuntimeError("NVML: Not Supported")


def test_nvml_reads_each_gpu_of_a_real_slice_by_its_physical_index():
    nodes = [NodeInfo("node0", 2, "H100", 81559), NodeInfo("node1", 2, "H100", 81559)]  # slices 0-1, 2-3
    nv = FakeNvml({0: (10, 100, 70_000, 35), 1: (20, 200, 80_000, 36), 2: (95, 70_000, 650_000, 71),
                   3: (0, 0, 60_000, 30)})
    agent = NodeAgent(nodes, {"node0": 0, "node1": 2}, nvml=lambda: nv)
    got = by_gpu(agent.read([]))
    assert got[("node1", 0)] == GpuReading("node1", 0, 95.0, 70_000.0, 650.0, 71.0, "nvml")
    assert got[("node0", 1)] == GpuReading("node0", 1, 20.0, 200.0, 80.0, 36.0, "nvml")
    assert len(got) == 4


def test_a_node_nvml_does_not_answer_for_is_emulated_and_a_missing_sensor_is_none():
    clock = iter([0.0, 2.0]).__next__
    nodes = [NodeInfo("node0", 2, "H100", 81559), NodeInfo("node1", 2, "H100", 81559)]
    nv = NoPowerSensor({0: (10, 100, 70_000, 35), 1: (20, 200, 80_000, 36)})  # node1's GPUs 2, 3 cannot say
    agent = NodeAgent(nodes, {"node0": 0, "node1": 2}, nvml=lambda: nv, clock=clock)
    holder = [Holder((7, 1, 0), (("node1", 1),), 10.0, 512.0)]
    assert {r.source for r in agent.read(holder)} == {"nvml"}  # node1: no rate yet
    got = by_gpu(agent.read([Holder((7, 1, 0), (("node1", 1),), 11.0, 512.0)]))
    assert got[("node0", 0)].power_w is None and got[("node0", 0)].util == 10.0
    # 1 CPU s over 2 s: half a core on one GPU
    assert got[("node1", 1)] == GpuReading("node1", 1, 50.0, 512.0, 230.0, 53.0, "emulated")


def test_no_nvml_at_all_emulates_and_a_rank_shares_its_rate_over_its_gpus():
    times = iter([0.0, 1.0, 2.0])
    agent = NodeAgent([NodeInfo("node0", 4, "emulated", 1024)], {}, nvml=lambda: None, clock=lambda: next(times))
    agent.read([Holder((1, 1, 0), (("node0", 0), ("node0", 1)), 5.0, 4096.0)])
    got = by_gpu(agent.read([Holder((1, 1, 0), (("node0", 0), ("node0", 1)), 6.5, 4096.0)]))
    # 1.5 cores over two GPUs: 75 % each; 2 GiB each, capped at the GPU's 1 GiB
    assert got[("node0", 0)].util == 75.0 and got[("node0", 1)].mem_mib == 1024.0
    # a reading lower than the last (counted anew) is no negative rate
    got = by_gpu(agent.read([Holder((1, 1, 0), (("node0", 0), ("node0", 1)), 1.0, 0.0)]))
    assert got[("node0", 0)].util == 0.0
