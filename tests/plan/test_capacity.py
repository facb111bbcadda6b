from trainyard.plan.capacity import find_min_nodes, min_nodes_for_jobs, resize_workload
from trainyard.sim.synthetic import generate


def fake(threshold: int, calls: list[int]):
    """p99 wait falls with nodes; the target 3600 is met from `threshold` nodes on."""

    def evaluate(n: int) -> dict:
        calls.append(n)
        return {"p99_wait_s": 3600.0 * threshold / n, "utilization": min(1.0, threshold / n)}

    return evaluate


def test_finds_minimum_from_below_and_above():
    for threshold in (1, 2, 7, 37, 80, 81, 300):
        for start in (None, 1, 10, 500):
            calls: list[int] = []
            ans = find_min_nodes(fake(threshold, calls), 3600.0, start=start)
            assert ans.nodes == threshold, (threshold, start)
            assert len(calls) == len(set(calls))  # each size simulated once
            assert [p.nodes for p in ans.probes] == calls
            assert all(p.ok == (p.nodes >= threshold) for p in ans.probes)


def test_respects_lo_and_max():
    calls: list[int] = []
    ans = find_min_nodes(fake(5, calls), 3600.0, lo=8)
    assert ans.nodes == 8 and calls == [8]
    ans = find_min_nodes(fake(500, []), 3600.0, max_nodes=100, start=10)
    assert ans.nodes is None and ans.probes[-1].nodes == 100


def test_tolerance_stops_early():
    calls: list[int] = []
    ans = find_min_nodes(fake(37, calls), 3600.0, start=1, tolerance=8)
    assert 37 <= ans.nodes <= 37 + 8
    exact: list[int] = []
    find_min_nodes(fake(37, exact), 3600.0, start=1)
    assert len(calls) < len(exact)


def test_resize_keeps_jobs_and_rescales_quotas():
    w = generate(jobs=60, cluster="8x8", seed=3)
    r = resize_workload(w, 13, 8)
    assert len(r.nodes) == 13 and r.total_gpus == 104 and r.jobs is w.jobs
    assert sum(t.quota("default").nominal for t in r.teams.values()) == 104
    gangs = any(j.req.gpus_per_node and j.req.min_nodes == 2 for j in w.jobs)
    assert min_nodes_for_jobs(w, 8) == (2 if gangs else 1)
