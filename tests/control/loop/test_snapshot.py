"""The loop's snapshot of waiting jobs: `PendingCache` gives the same jobs as building them anew."""

from __future__ import annotations

from collections import namedtuple

from trainyard.control.loop.schedule import PENDING_COLUMNS
from trainyard.control.loop.snapshot import PendingCache, pending_of

Row = namedtuple("Row", PENDING_COLUMNS)  # like a SQL row: by position and by name


def row(jid: int, **kw: object) -> Row:
    """A plain row with the columns the loop reads of a waiting job."""
    base: dict[str, object] = dict.fromkeys(PENDING_COLUMNS)  # a column added later: None here
    base |= dict(id=jid, team="vision", job_class="training", pool="default", submit_time=100.0 + jid, gpus=2,
                gpus_per_node=None, nodes_min=1, nodes_max=1, gpu_mem_mib=None, time_limit_s=3600.0,
                checkpoint_interval_s=None, attempt=0, queued_since=100.0 + jid, progress_s=0.0, attained_gpu_s=0.0,
                held=False, reason="None", est_start=None, avoid_nodes=None, eligible_time=None, array_job_id=None,
                array_task_id=None, array_throttle=None)
    base.update(kw)
    return Row(**base)


def test_unchanged_rows_give_the_same_jobs_and_changed_ones_are_rebuilt() -> None:
    cache = PendingCache(PENDING_COLUMNS)
    first = cache([row(1), row(2), row(3, avoid_nodes=["node-1"])])
    assert first == [pending_of(r) for r in (row(1), row(2), row(3, avoid_nodes=["node-1"]))]
    # the next pass: job 1 unchanged (a new reason and estimate do not matter), job 2 requeued
    # (attempt and queue time changed), job 3 avoids another node now, job 4 is new
    second = cache([row(1, reason="Priority", est_start=500.0), row(2, attempt=1, queued_since=400.0),
                    row(3, avoid_nodes=["node-2"]), row(4, gpus=8)])
    assert second[0] is first[0]
    assert second[1] is not first[1] and second[1] == pending_of(row(2, attempt=1, queued_since=400.0))
    assert second[2].req.avoid == frozenset({"node-2"})
    assert second[3] == pending_of(row(4, gpus=8))
    # a job whose dependency was met (or that was released) since: its wait counts from then
    third = cache([row(1, eligible_time=900.0)])
    assert third[0] is not second[0] and third[0].req.submit_time == 900.0 and second[0].req.submit_time == 101.0


def test_only_the_current_pass_is_kept() -> None:
    cache = PendingCache(PENDING_COLUMNS)
    cache([row(i) for i in range(100)])
    cache([row(1)])
    assert len(cache._last) == 1


def test_every_column_marked_for_the_engine_reaches_its_request_as_is() -> None:
    """store.models' `engine()` marks are the one list: each marked column lands in its JobRequest
    field unchanged, and the schedule step's query reads every marked column."""
    from trainyard.store.models import ENGINE_COLUMNS, REQUEST_FIELDS

    assert set(ENGINE_COLUMNS) <= set(PENDING_COLUMNS)
    values = {c: f"value-of-{c}" for c in REQUEST_FIELDS}
    values |= {"gpus_per_node": None}  # (the gang's total GPUs are derived from it)
    req = pending_of(row(7, **values)).req
    for column, field in REQUEST_FIELDS.items():
        assert getattr(req, field) == values[column], column


def test_a_placement_is_stored_in_slurms_node_order() -> None:
    """The engine may pick node-2 before node-0 (topology, free GPUs); the job's nodes are listed
    as Slurm lists an allocation's (by name, numbers by value), so its first node (where a batch
    script runs and a rendezvous is hosted) is node-0, and ranks follow that block order."""
    from trainyard.control.loop.snapshot import NodeIndex
    from trainyard.sched.cluster import Node, Placement

    nodes = (Node("node-0", 4), Node("node-1", 4), Node("node-2", 4))
    idx = NodeIndex(nodes, {n.name: i for i, n in enumerate(nodes)})
    rows = idx.to_rows(Placement(((2, (0, 1)), (0, (2, 3))), (100, 200)))
    assert rows == [{"node": "node-0", "gpus": [2, 3], "mem_mib": 200}, {"node": "node-2", "gpus": [0, 1], "mem_mib": 100}]


def test_the_ranks_launched_are_the_ranks_the_stored_rows_read_back() -> None:
    """The schedule step launches the engine's placement as `RankPlacement`s straight away and
    stores it as rows; reconcile and the API read the rows back into ranks later: both are the
    same ranks, in the same (Slurm's) node order, for every tasks-per-node."""
    from trainyard.contracts import RankPlacement
    from trainyard.control.loop.snapshot import NodeIndex
    from trainyard.sched.cluster import Node, Placement
    from trainyard.services.ranks import ranks_for

    nodes = (Node("node-0", 4), Node("node-1", 4), Node("node-2", 4))
    idx = NodeIndex(nodes, {n.name: i for i, n in enumerate(nodes)})
    p = Placement(((2, (0, 1)), (0, (2, 3))), (100, 200))
    assert idx.ranks(p, None) == [RankPlacement(0, "node-0", (2,)), RankPlacement(1, "node-0", (3,)),
                                  RankPlacement(2, "node-2", (0,)), RankPlacement(3, "node-2", (1,))]
    for per_node in (None, 1, 2, 3):
        assert idx.ranks(p, per_node) == ranks_for(idx.to_rows(p), per_node), per_node


def test_slurms_node_order_is_by_name_with_numbers_by_value() -> None:
    from trainyard.contracts import slurm_node_order

    assert sorted(["zeta", "node-10", "alpha", "node-2"], key=slurm_node_order) == ["alpha", "node-2", "node-10", "zeta"]
