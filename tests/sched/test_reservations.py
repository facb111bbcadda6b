"""Admin reservations in the engine (`sched/reservations.py`): held nodes, jobs in a reservation,
the time-limit rule before a reservation starts, expiry."""

from __future__ import annotations

from tests.sched.builders import CLASSES, nodes, pending, req, running, snapshot, teams
from trainyard.sched.cluster import ClusterState
from trainyard.sched.engine import TrainyardPolicy
from trainyard.sched.types import AdminReservation, JobClass, Reason

H = 3600.0


def _cycle(ns, run, pend, resv, now=100.0, classes=None):
    snap = snapshot(ns, teams(a=16, b=16), run, pend, now=now)
    if classes is not None:
        snap = type(snap)(**{**{f: getattr(snap, f) for f in snap.__slots__}, "classes": classes})
    snap = type(snap)(**{**{f: getattr(snap, f) for f in snap.__slots__}, "reservations": tuple(resv)})
    return TrainyardPolicy().cycle(snap)


def _nodes_of(res, ns, jid):
    for st in res.starts:
        if st.job_id == jid:
            return {ns[i].name for i in st.placement.node_indices}
    return None


def test_active_reservation_holds_its_nodes_from_other_jobs():
    ns = nodes(2, gpus=4)
    maint = AdminReservation("maint", frozenset({"n0"}), 0.0, 10 * H)
    # Two 4-GPU jobs: only n1 is free for them; the second waits with the reservation's reason.
    res = _cycle(ns, [], [pending(req(1, gpus=4, est_runtime_s=H)), pending(req(2, gpus=4, est_runtime_s=H))], [maint])
    assert _nodes_of(res, ns, 1) == {"n1"}
    assert _nodes_of(res, ns, 2) is None
    assert res.pending[2].reason == Reason.RESERVED


def test_job_in_reservation_runs_only_on_its_nodes_while_active():
    ns = nodes(3, gpus=4)
    r = AdminReservation("r", frozenset({"n1", "n2"}), 0.0, 10 * H)
    res = _cycle(ns, [], [pending(req(1, gpus=4, reservation="r", est_runtime_s=H)),
                          pending(req(2, gpus=4, gpus_per_node=4, min_nodes=2, max_nodes=2, reservation="r",
                                      est_runtime_s=H))], [r])
    assert _nodes_of(res, ns, 1) in ({"n1"}, {"n2"})
    # the second needs both of r's nodes; one is taken: it waits, though n0 is free
    assert _nodes_of(res, ns, 2) is None
    assert res.pending[2].reason in (Reason.CAPACITY, Reason.TOPOLOGY)


def test_job_waits_for_its_reservation_to_start_and_stays_out_after_its_end():
    ns = nodes(2, gpus=4)
    r = AdminReservation("r", frozenset({"n1"}), 2 * H, 3 * H)
    res = _cycle(ns, [], [pending(req(1, reservation="r"))], [r])
    assert not res.starts and res.pending[1].reason == Reason.RESV_WAIT and res.pending[1].est_start == 2 * H
    res = _cycle(ns, [], [pending(req(1, reservation="r"))], [r], now=2 * H + 1)
    assert _nodes_of(res, ns, 1) == {"n1"}
    res = _cycle(ns, [], [pending(req(1, reservation="r"))], [r], now=3 * H)
    assert not res.starts and res.pending[1].reason == Reason.RESV_GONE
    res = _cycle(ns, [], [pending(req(1, reservation="gone"))], [])
    assert not res.starts and res.pending[1].reason == Reason.RESV_GONE


def test_job_that_would_run_into_a_future_reservation_does_not_start_there():
    ns = nodes(1, gpus=4)
    r = AdminReservation("r", frozenset({"n0"}), 100.0 + 2 * H, 100.0 + 3 * H)
    res = _cycle(ns, [], [pending(req(1, est_runtime_s=3 * H)), pending(req(2, est_runtime_s=H))], [r])
    assert _nodes_of(res, ns, 2) == {"n0"}  # ends before the reservation starts
    assert _nodes_of(res, ns, 1) is None and res.pending[1].reason == Reason.RESERVED


def test_no_time_limit_counts_as_the_class_max_run_time():
    ns = nodes(1, gpus=4)
    r = AdminReservation("r", frozenset({"n0"}), 100.0 + 2 * H, 100.0 + 3 * H)
    classes = {**CLASSES, "short": JobClass("short", 200, max_run_s=H), "long": JobClass("long", 200, max_run_s=5 * H)}
    res = _cycle(ns, [], [pending(req(1, cls="long")), pending(req(2, cls="short")), pending(req(3, cls="batch"))],
                 [r], classes=classes)
    assert _nodes_of(res, ns, 2) == {"n0"}
    assert res.pending[1].reason == Reason.RESERVED
    assert res.pending[3].reason == Reason.RESERVED  # no max run time at all: for ever


def test_expired_reservation_holds_nothing():
    ns = nodes(1, gpus=4)
    r = AdminReservation("r", frozenset({"n0"}), 0.0, 50.0)
    res = _cycle(ns, [], [pending(req(1, gpus=4))], [r])
    assert _nodes_of(res, ns, 1) == {"n0"}


def test_other_reservations_hold_their_nodes_from_a_reserved_job_too():
    ns = nodes(2, gpus=4)
    mine = AdminReservation("mine", frozenset({"n0", "n1"}), 0.0, 10 * H)
    later = AdminReservation("later", frozenset({"n1"}), 100.0 + H, 100.0 + 2 * H)
    res = _cycle(ns, [], [pending(req(1, gpus=4, reservation="mine", est_runtime_s=2 * H)),
                          pending(req(2, gpus=4, reservation="mine", est_runtime_s=2 * H))], [mine, later])
    assert _nodes_of(res, ns, 1) == {"n0"}
    assert _nodes_of(res, ns, 2) is None


def test_no_preemption_on_reserved_nodes_for_outsiders():
    ns = nodes(2, gpus=4)
    state = ClusterState(ns)
    low = running(state, req(10, team="b", cls="batch", gpus=4), at=((0, (0, 1, 2, 3)),))
    r = AdminReservation("r", frozenset({"n0"}), 0.0, 10 * H)
    # n1 is free for one of the two; the other may not take n0 by preempting its batch job.
    res = _cycle(ns, [low], [pending(req(1, cls="interactive", gpus=4)), pending(req(2, cls="interactive", gpus=4))],
                 [r], now=1000.0)
    assert not res.preemptions
    assert len(res.starts) == 1 and {ns[i].name for i in res.starts[0].placement.node_indices} == {"n1"}


def test_memo_of_a_masked_failure_is_not_used_for_a_job_in_the_reservation():
    ns = nodes(1, gpus=4)
    r = AdminReservation("r", frozenset({"n0"}), 0.0, 10 * H)
    res = _cycle(ns, [], [pending(req(1, gpus=2)), pending(req(2, gpus=2, reservation="r"))], [r])
    assert res.pending[1].reason == Reason.RESERVED
    assert _nodes_of(res, ns, 2) == {"n0"}


def test_without_reservations_nothing_changes():
    ns = nodes(2, gpus=4)
    pend = [pending(req(i, gpus=4)) for i in (1, 2, 3)]
    a = _cycle(ns, [], pend, [])
    snap = snapshot(ns, teams(a=16, b=16), [], pend, now=100.0)
    b = TrainyardPolicy().cycle(snap)
    assert a.starts == b.starts and {k: v.reason for k, v in a.pending.items()} == {k: v.reason for k, v in b.pending.items()}
