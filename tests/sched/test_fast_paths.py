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
    # Keys 2-5 (`sort_key`), then the tier: in quota if it fits in what its team's jobs of its
    # priority or more leave; tier 0 first, then tier 1, each in key order.
    keyed = sorted(((sort_key(pj, snap.classes[pj.req.job_class], snap.now, fs[pj.req.pool].get(pj.req.team, 1.0), p,
                              snap.teams[pj.req.team].las_for(pj.req.job_class) if pj.req.team in snap.teams else False),
                     pj) for pj in snap.pending), key=lambda kp: kp[0])
    tiers = []
    for _, pj in keyed:
        r = pj.req
        prio = snap.classes[r.job_class].priority
        held = sum(x.gpus for x in snap.running if (x.req.team, x.req.pool) == (r.team, r.pool)
                   and snap.classes[x.req.job_class].priority >= prio)
        tiers.append(0 if r.min_gpus <= ledger.nominal(r.team, r.pool) - held else 1)
    first = [kp for t, kp in zip(tiers, keyed) if t == 0]
    keyed = (first + [kp for t, kp in zip(tiers, keyed) if t == 1], len(first))
    return keyed, ledger, fs


def _fast_order(snap: Snapshot, p: OrderingParams, ledger: QuotaLedger, fs):
    held: dict[tuple[str, str, int], int] = {}
    for x in snap.running:
        k = (x.req.team, x.req.pool, snap.classes[x.req.job_class].priority)
        held[k] = held.get(k, 0) + x.gpus

    def headroom(team: str, pool: str, prio: int) -> int:
        return ledger.nominal(team, pool) - sum(g for (t, po, q), g in held.items() if (t, po) == (team, pool) and q >= prio)

    return keyed_in_order(snap.pending, snap.classes, snap.now, headroom, fs, p, snap.teams)


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
    assert got == ref and {k[1] for k, _ in got[0]} == {0, 1}  # urgent and scored jobs both present


@SETTINGS
@given(snapshots(), st.floats(-3600, 3600))
def test_lost_if_stopped_equals_its_definition(snap: Snapshot, shift: float):
    now = snap.now + shift
    for r in snap.running:
        assert r.lost_if_stopped(now) == (now - max(r.start_time, r.saved_at(now))) * r.gpus
