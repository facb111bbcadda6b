"""The storage meter's refresh (`StorageMeter.refresh`, an admin's `yard storage --refresh`) and its
kinds: a walk cut at its budget is an estimate until the next sweep, but a refresh measures every
job dir now, whole, so its apparent bytes per kind are `du -sbx`'s to the byte; the thread's sweep
and a refresh never walk at once."""

from __future__ import annotations

import threading

from tests.control.lifecycle.test_storage import MiB, job_with_dir, plane, spec, write  # noqa: F401 - the fixture
from tests.services.test_retention_rules import apparent


def test_a_refresh_measures_every_dir_whole_and_sorts_its_bytes_by_kind(plane):  # noqa: F811
    p, meter = plane, plane.cp.storage
    v = job_with_dir(p, "vision")
    for i in range(1500):
        (v.logs / f"f{i}").write_bytes(b"x" * (i % 7))
    write(v.checkpoints / "w.pt", MiB + 3)
    (v.root / "metrics" / "metrics.jsonl").write_text('{"step": 1}\n')
    meter.walk_budget_s = -1  # the thread's sweeps are cut at once
    meter.sweep()
    assert not meter.job(v.root.name)["complete"]
    meter.refresh()
    assert meter.walk_budget_s == -1  # the budget is the thread's again after
    [d] = [d for d in meter.dirs() if d.name == v.root.name]
    kinds = dict(d.kinds)
    assert d.complete and d.apparent == apparent(v.root) == sum(kinds.values())
    assert kinds["logs"] == apparent(v.logs) and kinds["checkpoints"] == apparent(v.checkpoints)
    assert kinds["metrics"] == apparent(v.root / "metrics") and kinds["other"] > 0
    rep = meter.report(spec(p))
    vision = next(t for t in rep["teams"] if t["team"] == "vision")
    assert vision["apparent_bytes"] == d.apparent and vision["kinds"] == kinds


def test_a_refresh_waits_for_a_sweep_under_way(plane):  # noqa: F811
    p, meter = plane, plane.cp.storage
    job_with_dir(p, "nlp")
    meter._sweeping.acquire()  # a sweep under way on the thread
    done = threading.Event()
    t = threading.Thread(target=lambda: (meter.refresh(), done.set()))
    t.start()
    assert not done.wait(0.3)
    meter._sweeping.release()
    assert done.wait(10)
    t.join()


def test_the_kinds_are_gauges_too(plane):  # noqa: F811
    p, meter = plane, plane.cp.storage
    v = job_with_dir(p, "nlp")
    write(v.logs / "rank-0.log", 12_345)
    meter.refresh()
    [d] = [d for d in meter.dirs() if d.name == v.root.name]
    metrics = dict(line.rsplit(" ", 1) for line in p.admin.get("/metrics").text.splitlines()
                   if line.startswith("trainyard_team_storage_kind_bytes"))
    assert float(metrics['trainyard_team_storage_kind_bytes{kind="logs",team="nlp"}']) == dict(d.kinds)["logs"]
    assert float(metrics['trainyard_team_storage_kind_bytes{kind="checkpoints",team="vision"}']) == 0
