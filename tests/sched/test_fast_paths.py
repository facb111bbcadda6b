"""The engine's inlined hot loops compute exactly what their one-job reference functions define.

`estimate.running_ends`, `ordering.keyed_in_order` and `RunningJob.lost_if_stopped` repeat, with
the per-call overhead taken out, formulas written once more readably in `estimate.expected_end`,
`ordering.sort_key` and `RunningJob.saved_at`. These tests keep each pair equal, bit for bit, on
random snapshots and on the scheduling benchmark's synthetic snapshot.
"""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from trainyard.sched.estimate import expected_end, running_ends
from trainyard.sched.ordering import OrderingParams, fairshare_factors, keyed_in_order, sort_key
from trainyard.sched.quota import QuotaLedger
from trainyard.sched.synthetic_snapshot import build_snapshot
from trainyard.sched.types import Snapshot

from tests.sched.test_properties import SETTINGS, snapshots

BENCH = build_snapshot(nodes=60, gpus_per_node=8, pending=400, running=300, seed=3)


def _reference_ends(snap: Snapshot) -> dict[str, list[tuple[float, int]]]:
    out: dict[str, list[tuple[float, int]]] = {}
    for r in snap.running:
        e = expected_end(r, snap.classes[r.req.job_class], snap.now)
        if e != math.inf:
            out.setdefault(r.req.pool, []).append((e, r.gpus))
    return out


def _reference_order(snap: Snapshot, p: OrderingParams):
    ledger = QuotaLedger(snap.teams, ((r.req.team, r.req.pool, r.gpus) for r in snap.running))
    fs = {pj.req.pool: fairshare_factors(snap.teams, snap.usage, pj.req.pool, p.fairshare_weight) for pj in snap.pending}
    keyed = []
    for pj in snap.pending:
        r = pj.req
        room = ledger.nominal(r.team, r.pool) - ledger.used(r.team, r.pool)
        keyed.append((sort_key(pj, snap.classes[r.job_class], snap.now, r.min_gpus <= room, fs[r.pool].get(r.team, 1.0), p), pj))
    keyed.sort(key=lambda kp: kp[0])
    return keyed, ledger, fs


def _fast_order(snap: Snapshot, p: OrderingParams, ledger: QuotaLedger, fs):
    return keyed_in_order(snap.pending, snap.classes, snap.now,
                          lambda team, pool: ledger.nominal(team, pool) - ledger.used(team, pool), fs, p)


@SETTINGS
@given(snapshots())
def test_running_ends_equal_expected_end(snap: Snapshot):
    assert running_ends(snap.running, snap.classes, snap.now) == _reference_ends(snap)


def test_running_ends_on_the_benchmark_snapshot():
    got = running_ends(BENCH.running, BENCH.classes, BENCH.now)
    assert got == _reference_ends(BENCH) and sum(map(len, got.values())) > 200


@SETTINGS
@given(snapshots(), st.sampled_from([OrderingParams(), OrderingParams(reserve_at=0.5, aging_weight=1.0)]))
def test_keyed_in_order_equals_sort_key(snap: Snapshot, p: OrderingParams):
    ref, ledger, fs = _reference_order(snap, p)
    assert _fast_order(snap, p, ledger, fs) == ref


def test_keyed_in_order_on_the_benchmark_snapshot():
    p = OrderingParams()
    ref, ledger, fs = _reference_order(BENCH, p)
    got = _fast_order(BENCH, p, ledger, fs)
    assert got == ref and {k[2] for k, _ in got} == {0, 1}  # urgent and scored jobs both present


@SETTINGS
@given(snapshots(), st.floats(-3600, 3600))
def test_lost_if_stopped_equals_its_definition(snap: Snapshot, shift: float):
    now = snap.now + shift
    for r in snap.running:
        assert r.lost_if_stopped(now) == (now - max(r.start_time, r.saved_at(now))) * r.gpus
