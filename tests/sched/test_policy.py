"""The policy registry and the cycle wrapper every policy shares."""

from __future__ import annotations

import gc

import pytest

from trainyard.sched.policy import gc_paused, get_policy, policy_names
from trainyard.sched.synthetic_snapshot import build_snapshot
from trainyard.sched.types import CycleResult


class _Probe:
    def __init__(self, fail: bool = False):
        self.fail, self.seen = fail, None

    @gc_paused
    def cycle(self, snap) -> CycleResult:
        self.seen = gc.isenabled()
        if self.fail:
            raise RuntimeError("boom")
        return CycleResult()


def test_collector_paused_during_a_cycle_and_back_on_after():
    p = _Probe()
    assert gc.isenabled()
    p.cycle(None)
    assert p.seen is False and gc.isenabled()


def test_collector_back_on_after_a_cycle_that_raised():
    with pytest.raises(RuntimeError):
        _Probe(fail=True).cycle(None)
    assert gc.isenabled()


def test_a_collector_already_off_stays_off():
    gc.disable()
    try:
        _Probe().cycle(None)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_every_registered_policy_pauses_the_collector_and_decides_the_same():
    snap = build_snapshot(nodes=20, gpus_per_node=8, pending=120, running=80, seed=1)
    for name in policy_names():
        pol = get_policy(name)
        assert getattr(type(pol).cycle, "__wrapped__", None) is not None, f"{name} does not use gc_paused"
        assert repr(pol.cycle(snap)) == repr(pol.cycle(snap))
    with pytest.raises(ValueError, match="unknown policy"):
        get_policy("nope")
