from collections import Counter

from trainyard.sim.synthetic import generate


def test_deterministic_and_shaped():
    w = generate(jobs=400, cluster="8x8", seed=1)
    assert generate(jobs=400, cluster="8x8", seed=1).jobs == w.jobs
    assert generate(jobs=400, cluster="8x8", seed=2).jobs != w.jobs
    assert len(w.jobs) == 400 and w.total_gpus == 64
    times = [j.req.submit_time for j in w.jobs]
    assert times == sorted(times)
    assert [j.req.id for j in w.jobs] == list(range(400))  # ints in submission order
    assert [j.label for j in w.jobs[:2]] + [w.jobs[-1].label] == ["s00000", "s00001", "s00399"]  # seeds estimates
    classes = Counter(j.req.job_class for j in w.jobs)
    assert set(classes) == {"interactive", "training", "batch"} and set(w.classes) == set(classes)
    assert classes["batch"] > classes["training"]
    # teams: unequal quotas summing to the cluster, one cohort
    nominal = sorted(t.quota("default").nominal for t in w.teams.values())
    assert sum(nominal) == 64 and len(set(nominal)) == 3
    assert len({t.cohort for t in w.teams.values()}) == 1
    assert {j.req.team for j in w.jobs} == set(w.teams)


def test_job_shapes_and_load():
    w = generate(jobs=600, cluster="8x8", seed=5)
    reqs = [j.req for j in w.jobs]
    inter = [j for j in w.jobs if j.req.job_class == "interactive"]
    assert all(j.req.gpus <= 2 and 300 <= j.duration_s <= 3600 for j in inter)
    assert any(r.gpus_per_node == 8 and r.min_nodes == r.max_nodes == 2 for r in reqs)
    assert any(r.elastic and r.min_nodes == 1 and r.max_nodes == 2 for r in reqs)
    assert any(r.gpu_mem_mib is not None and r.gpu_mem_mib < 80 * 1024 for r in reqs)
    train = [j for j in w.jobs if j.req.job_class == "training"]
    assert all(3600 <= j.duration_s <= 86400 and j.req.checkpoint_interval_s == 1800 for j in train)
    batch = [j for j in w.jobs if j.req.job_class == "batch"]
    assert all(j.req.gpus == 1 and 600 <= j.duration_s <= 7200 for j in batch)
    # interactive jobs in working hours (weekdays 9-18), batch in evening bursts
    assert all(9 <= (j.req.submit_time % 86400) / 3600 < 18 for j in inter)
    assert sum(18 <= (j.req.submit_time % 86400) / 3600 < 24 for j in batch) > 0.8 * len(batch)
    span = w.measure_to
    load = sum(j.duration_s * j.req.max_gpus for j in w.jobs) / (w.total_gpus * span)
    assert 0.85 <= load <= 1.1
    assert abs(w.measure_from - 0.1 * span) < 1e-6
    assert 0 < sum(w.measured(t) for t in (r.submit_time for r in reqs)) < len(reqs)


def test_other_sizes():
    w = generate(jobs=50, cluster="2x4", seed=3, teams=5, days=2)
    assert w.total_gpus == 8 and len(w.teams) == 5 and w.measure_to == 2 * 86400
    assert sum(t.quota("default").nominal for t in w.teams.values()) == 8
    assert all(j.req.max_gpus <= 8 for j in w.jobs)
