"""The GPU half of "is this allocation idle" (`backends/local/gpu_use.py`, `LocalBackend.gpu_percent`).

This machine has no NVML, so NVML is a pynvml-shaped double here; the mapping from an attempt's
GPUs to NVML indices (node slices of this machine's GPUs) is the backend's own, checked with a real
launch. What runs on a machine with GPUs: the same code against the real pynvml.
"""

from __future__ import annotations

from types import SimpleNamespace

from tests.accounts import shared_dir
from tests.backends.helpers import make_spec
from trainyard.backends import LocalBackend
from trainyard.backends.base import NodeInfo
from trainyard.backends.local import gpu_use


class FakeNvml:
    """GPU i reads `rates[i]`; an index not in it raises, as NVML does for a GPU it cannot read."""

    def __init__(self, rates: dict[int, int]):
        self.rates = rates

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802 - NVML's name
        if i not in self.rates:
            raise RuntimeError(f"NVML: no GPU {i}")
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(gpu=self.rates[h], memory=0)


def test_the_busiest_of_the_gpus_asked_and_none_when_none_reads():
    nv = FakeNvml({0: 3, 1: 87, 2: 40})
    assert gpu_use.busiest([0, 2], lib=nv) == 40
    assert gpu_use.busiest([0, 1, 2], lib=nv) == 87
    assert gpu_use.busiest([0, 9], lib=nv) == 3  # one that cannot be read is skipped
    assert gpu_use.busiest([9], lib=nv) is None


def test_an_attempt_on_slices_of_real_gpus_asks_nvml_for_its_physical_indices(monkeypatch):
    asked: list[list[int]] = []
    monkeypatch.setattr(gpu_use, "busiest", lambda indices, lib=None: asked.append(list(indices)) or 50.0)
    nodes = [NodeInfo("node0", 2, "H100", 81559), NodeInfo("node1", 2, "H100", 81559)]  # slices 0-1, 2-3
    with shared_dir("tygpu-") as place:
        data = place / "data"
        data.mkdir(mode=0o711)
        be = LocalBackend(data, nodes, containment="subreaper")
        try:
            be.launch(make_spec(data, 1, ["sleep", "30"], ranks=((0, "node0", (1,)), (1, "node1", (0, 1)))))
            assert be.gpu_percent(1, 1) == 50.0
            assert asked == [[1, 2, 3]]  # node0's GPU 1; node1's GPUs 0 and 1 are physical 2 and 3
            assert be.gpu_percent(2, 1) is None
        finally:
            for a in be.poll():
                be.release(a.job_id, a.attempt)
            be.close()
