import math
import random

import pytest

from trainyard.sched.types import JobRequest
from trainyard.sim.estimates import COMMON_LIMITS_S, apply_estimates, user_estimate
from trainyard.sim.workload import SimJob


def _jobs(n=300):
    return [SimJob(JobRequest(i, "t", "training", float(i)), float(10 + 37 * i ** 1.7), label=f"j{i}") for i in range(n)]


def test_none_and_oracle():
    jobs = _jobs()
    assert all(j.req.est_runtime_s is None for j in apply_estimates(jobs, "none", 1))
    oracle = apply_estimates(jobs, "oracle", 1)
    assert [j.req.est_runtime_s for j in oracle] == [j.duration_s for j in jobs]
    assert [j.req.id for j in oracle] == [j.req.id for j in jobs] and oracle[0].duration_s == jobs[0].duration_s


def test_user_overestimates_to_common_limits():
    jobs = _jobs()
    est = apply_estimates(jobs, "user", 7)
    for j, e in zip(jobs, est):
        v = e.req.est_runtime_s
        assert v >= j.duration_s
        if j.duration_s * 5 <= COMMON_LIMITS_S[-1]:
            assert v in COMMON_LIMITS_S
            # the next limit up from duration x factor, factor <= 5
            smaller = [c for c in COMMON_LIMITS_S if c < v]
            assert not smaller or smaller[-1] < j.duration_s * 5
        else:
            assert v <= j.duration_s * 5 or v == COMMON_LIMITS_S[-1]
    factors = [e.req.est_runtime_s / j.duration_s for j, e in zip(jobs, est)]
    assert len({round(f, 3) for f in factors}) > 20  # noisy, not a constant factor


def test_user_deterministic_per_seed_and_job():
    jobs = _jobs()
    a = apply_estimates(jobs, "user", 3)
    b = apply_estimates(list(reversed(jobs)), "user", 3)
    assert {j.req.id: j.req.est_runtime_s for j in a} == {j.req.id: j.req.est_runtime_s for j in b}
    c = apply_estimates(jobs, "user", 4)
    assert [j.req.est_runtime_s for j in a] != [j.req.est_runtime_s for j in c]
    assert apply_estimates(jobs[:10], "user", 3) == a[:10]


def test_beyond_largest_limit_is_not_rounded():
    job = SimJob(JobRequest(1, "t", "training", 0.0), 100 * 86400.0, label="huge")
    v = apply_estimates([job], "user", 1)[0].req.est_runtime_s
    assert 100 * 86400.0 <= v <= 500 * 86400.0 and v not in COMMON_LIMITS_S and math.isfinite(v)


def test_unknown_mode():
    with pytest.raises(ValueError, match="oracle"):
        apply_estimates(_jobs(2), "psychic", 1)


def test_user_estimates_are_seeded_from_the_label_not_the_int_id():
    """Ids became ints; the draws of every published figure were made from the string ids
    ("p00001"), which the loaders keep as labels. An unlabelled job is named by its id."""
    labelled = SimJob(JobRequest(1, "t", "training", 0.0), 5000.0, label="p00001")
    plain = SimJob(JobRequest(1, "t", "training", 0.0), 5000.0)
    assert (labelled.name, plain.name) == ("p00001", "1")
    (got,) = apply_estimates([labelled], "user", 1)
    assert got.req.est_runtime_s == user_estimate(5000.0, random.Random("1:p00001"))
    assert got.label == "p00001" and got.req.id == 1
    (unnamed,) = apply_estimates([plain], "user", 1)
    assert unnamed.req.est_runtime_s == user_estimate(5000.0, random.Random("1:1"))
