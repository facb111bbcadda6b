"""GPU memory and job ids on their way from the API and the config to the engine: GB is converted
to MiB once, where people write it, and the engine gets exactly the MiB the store holds (no
GB -> MiB -> GB -> MiB round trip that could round twice); job ids stay the store's ints."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from tests.plane import Plane
from trainyard.control.loop.snapshot import NodeIndex, pending_of, request_of
from trainyard.sched.cluster import ClusterState
from trainyard.sched.engine import TrainyardPolicy
from trainyard.sched.types import Snapshot
from trainyard.store.models import JobRow

# Node sizes that are and are not whole GB, and one that is not a whole MiB either.
CONFIG = """\
cluster:
  name: units
  nodes:
    - {name: whole, count: 2, gpus: 2, gpu_model: emulated, gpu_mem_gb: 16}
    - {name: half, gpus: 1, gpu_model: emulated, gpu_mem_gb: 40.5}
    - {name: odd, gpus: 1, gpu_model: emulated, gpu_mem_gb: 23.9}
teams:
  - {name: vision, quotas: {default: {nominal: 6}}}
classes:
  - {name: training, priority: 200, preemptible: true, max_wait: 24h, grace_period: 3}
default_class: training
"""
NODE_MIB = {"whole-0": 16384, "whole-1": 16384, "half": 41472, "odd": round(23.9 * 1024)}  # 24474
# What people ask, in GB, and the MiB that must reach the engine: `round(gb * 1024)`, once.
ASKED = [(0.5, 512), (1.001, 1025), (8, 8192), (15.9999, 16384), (23.9, 24474), (0.001, 1)]


@pytest.fixture(scope="module")
def p(tmp_path_factory: pytest.TempPathFactory):
    cfg = tmp_path_factory.mktemp("units_cfg") / "cluster.yaml"
    cfg.write_text(CONFIG)
    plane = Plane(tmp_path_factory.mktemp("units"), config=Path(cfg), start=False)  # no loop: we read the seam
    try:
        yield plane
    finally:
        plane.stop()


def test_config_gb_reaches_the_engines_nodes_as_exact_mib(p):
    with p.cp.store.session() as s:
        cfg = p.cp.configs.current(s)
    assert {n.name: n.gpu_mem_mib for n in cfg.nodes} == NODE_MIB
    idx = NodeIndex.build(cfg, {})
    assert {n.name: n.gpu_mem_mib for n in idx.nodes} == NODE_MIB
    assert ClusterState(idx.nodes).cap_mib == [NODE_MIB[n.name] for n in idx.nodes]
    # Shown to people in GB again, converted once where shown.
    shown = {n["name"]: n["gpu_mem_gb"] for n in p.admin.get("/api/v1/nodes").json()["nodes"]}
    assert shown == {name: mib / 1024 for name, mib in NODE_MIB.items()}


def test_api_gb_arrives_in_the_engines_request_as_the_mib_the_store_holds(p):
    ids = [p.submit(command=["true"], team="vision", gpus=1, gpu_mem_gb=gb)["id"] for gb, _ in ASKED]
    with p.cp.store.session() as s:
        rows = {r.id: r for r in s.scalars(select(JobRow).where(JobRow.id.in_(ids)))}
        cfg = p.cp.configs.current(s)
        for jid, (gb, mib) in zip(ids, ASKED):
            row = rows[jid]
            assert row.gpu_mem_mib == mib, gb
            req = request_of(row)
            assert req.gpu_mem_mib == row.gpu_mem_mib == mib and type(req.gpu_mem_mib) is int
            assert req.id == jid and type(req.id) is int  # the store's id, passed as is
            assert p.job(jid)["gpu_mem_gb"] == mib / 1024  # what the API shows: the stored MiB as GB
        pending = [pending_of(rows[j]) for j in ids]
    # And a cycle places each on a GPU with exactly that much memory taken.
    idx = NodeIndex.build(cfg, {})
    teams, classes = cfg.sched
    snap = Snapshot(now=1e9, cluster=ClusterState(idx.nodes), teams=teams, classes=classes, running=[],
                    pending=pending)
    res = TrainyardPolicy().cycle(snap)
    assert sorted(st.job_id for st in res.starts) == sorted(ids)
    taken = {st.job_id: st.placement.mem_mib for st in res.starts}
    assert taken == {jid: (mib,) for jid, (_, mib) in zip(ids, ASKED)}
