"""The goodput split (services/goodput.py): every allocated GPU-second in exactly one bucket, each
bucket measured from the fact it says, whatever the job wrote in its phase files."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.contracts import LEDGER_BUCKETS
from trainyard.services import goodput
from trainyard.services.goodput import AttemptFacts, RankPhases, Sample, parse_phases, split
from tests.hypothesis_setup import examples

T0 = 1_000_000.0


def phase_file(rank: int, *, began: float, last: float | None, data_wait: float = 0.0, ckpt: float = 0.0,
               comm: float = 0.0, after: float = 0.0, recent: list[float] | None = None, attempt: int = 1) -> dict:
    """A phase file as the runtime writes it (the contract above contracts.PHASES_DIR)."""
    return {"v": 1, "attempt": attempt, "rank": rank, "began": began, "last": last, "step": 10, "steps": 10,
            "phases": {"step": 1.0, "data_wait": data_wait, "checkpoint_stall": ckpt, "comm": comm},
            "after_last": {"checkpoint_stall": after}, "ended": None,
            "recent": [[i, s, 0.0] for i, s in enumerate(recent or [1.0])]}


def ranks(*files: dict) -> tuple[RankPhases, ...]:
    out = tuple(parse_phases(f, f["attempt"], f["rank"]) for f in files)
    assert all(r is not None for r in out)
    return out  # type: ignore[return-value]


def adds_up(b: dict[str, float], total: float) -> None:
    assert set(b) == set(LEDGER_BUCKETS)
    assert all(v >= 0 for v in b.values()), b
    assert math.isclose(math.fsum(b.values()), total, rel_tol=1e-9, abs_tol=1e-6), (math.fsum(b.values()), total)


# -- per bucket, with phase files ---------------------------------------------------------------------

def test_phases_split_startup_waits_compute_and_teardown():
    f = AttemptFacts(start=T0, end=T0 + 100, gpus=2,
                     ranks=ranks(phase_file(0, began=T0 + 10, last=T0 + 90, data_wait=8, ckpt=4, comm=5, after=3),
                                 phase_file(1, began=T0 + 10, last=T0 + 90, data_wait=8, ckpt=4, comm=1, after=3)))
    b = split(f)
    adds_up(b, 200)
    assert b["startup"] == pytest.approx(2 * 10)
    assert b["data_wait"] == pytest.approx(2 * 8)  # a data loader that sleeps
    assert b["checkpoint_stall"] == pytest.approx(2 * (4 + 3))  # synchronous saves, and the final one
    assert b["comm_wait"] == pytest.approx(2 * (4 / 2))  # rank 0 waited 4 s beyond rank 1: the mean
    assert b["teardown"] == pytest.approx(2 * 7)
    assert b["compute"] == pytest.approx(2 * (80 - 8 - 4) - 4)
    assert b["idle"] == 0 and b["recompute"] == 0


def test_recompute_is_the_lost_work_carved_out_of_compute():
    f = AttemptFacts(start=T0, end=T0 + 100, gpus=1, lost_gpu_s=30,
                     ranks=ranks(phase_file(0, began=T0 + 10, last=T0 + 100)))
    b = split(f)
    adds_up(b, 100)
    assert b["recompute"] == pytest.approx(30) and b["compute"] == pytest.approx(60)


def test_lost_work_beyond_compute_comes_out_of_the_other_buckets_in_order():
    samples = (Sample(T0 + 100, 50, 0.0),)  # idle 50..100
    f = AttemptFacts(start=T0, end=T0 + 100, gpus=1, lost_gpu_s=80, first_output_at=T0 + 20, samples=samples)
    b = split(f)  # startup 20, compute 30, idle 50 before the lost work
    adds_up(b, 100)
    assert b["recompute"] == pytest.approx(80) and b["compute"] == 0 and b["idle"] == 0
    assert b["startup"] == pytest.approx(20)
    b = split(AttemptFacts(**{**f.__dict__, "lost_gpu_s": 1e9}))  # a bare job's whole attempt, and more
    assert b["recompute"] == pytest.approx(100)


def test_a_running_attempt_whose_steps_stopped_is_idle_beyond_the_stall_limit():
    recent = [2.0] * 10  # median 2 s: the limit is max(60, 20) = 60 s
    f = AttemptFacts(start=T0, end=T0 + 500, gpus=4, running=True,
                     ranks=ranks(phase_file(0, began=T0 + 20, last=T0 + 200, recent=recent)))
    b = split(f)
    adds_up(b, 2000)
    assert b["idle"] == pytest.approx(4 * (300 - 60))
    assert b["teardown"] == 0 and b["compute"] == pytest.approx(4 * (180 + 60))


def test_a_running_attempt_stepping_now_has_no_idle():
    f = AttemptFacts(start=T0, end=T0 + 100, gpus=1, running=True,
                     ranks=ranks(phase_file(0, began=T0 + 20, last=T0 + 99)))
    b = split(f)
    assert b["idle"] == 0 and b["compute"] == pytest.approx(80)


def test_an_ended_attempt_that_stalled_before_its_stop_is_idle_then_teardown():
    f = AttemptFacts(start=T0, end=T0 + 1000, gpus=1, stop_at=T0 + 900,
                     ranks=ranks(phase_file(0, began=T0 + 10, last=T0 + 100)))
    b = split(f)
    adds_up(b, 1000)
    assert b["idle"] == pytest.approx(800 - 60)  # 800 s without a step before the stop, less the limit
    assert b["teardown"] == pytest.approx(100 + 60)


def test_a_rank_that_never_stepped_is_startup_until_the_stop():
    f = AttemptFacts(start=T0, end=T0 + 100, gpus=1, stop_at=T0 + 80,
                     ranks=ranks(phase_file(0, began=T0 + 30, last=None)))
    b = split(f)
    assert b["startup"] == pytest.approx(80) and b["teardown"] == pytest.approx(20) and b["compute"] == 0


def test_nonsense_in_the_phase_file_is_clamped_into_the_attempt():
    f = AttemptFacts(start=T0, end=T0 + 100, gpus=1,
                     ranks=ranks(phase_file(0, began=T0 - 5000, last=T0 + 9e9, data_wait=1e6, ckpt=float("nan"),
                                            comm=-4, after=1e9)))
    b = split(f)
    adds_up(b, 100)
    assert b["startup"] == 0 and b["data_wait"] == pytest.approx(100)


@pytest.mark.parametrize("bad", [None, [], {"v": 2}, {"v": 1, "attempt": 2, "rank": 0, "began": T0},
                                 {"v": 1, "attempt": 1, "rank": 1, "began": T0},
                                 {"v": 1, "attempt": 1, "rank": 0, "began": "soon"},
                                 {"v": 1, "attempt": 1, "rank": 0, "began": True}])
def test_a_file_that_is_not_this_ranks_is_none(bad):
    assert parse_phases(bad, 1, 0) is None


def test_phases_of_strings_and_huge_numbers_read_as_nothing():
    r = parse_phases({"v": 1, "attempt": 1, "rank": 0, "began": T0, "last": "x",
                      "phases": {"data_wait": "1", "comm": 10**400}, "after_last": [], "recent": [[1, "x"], 5]}, 1, 0)
    assert r is not None and r.last is None and r.data_wait == 0 and r.comm == 0 and r.recent_steps == ()


# -- the coarse split of a bare job -------------------------------------------------------------------

def test_a_bare_job_starts_up_until_its_first_output_then_computes_then_tears_down():
    f = AttemptFacts(start=T0, end=T0 + 100, gpus=2, first_output_at=T0 + 15, stop_at=T0 + 90)
    b = split(f)
    adds_up(b, 200)
    assert b["startup"] == pytest.approx(30) and b["teardown"] == pytest.approx(20)
    assert b["compute"] == pytest.approx(150)  # no sample covers it: unknown counts as used


def test_the_idle_policys_stretch_is_idle_even_without_telemetry():
    # requeued by its class's idle policy at T0+90 after being idle since T0+30: no sample says so
    f = AttemptFacts(start=T0, end=T0 + 100, gpus=2, first_output_at=T0 + 10, stop_at=T0 + 90, idle_from=T0 + 30)
    b = split(f)
    adds_up(b, 200)
    assert b["idle"] == pytest.approx(120) and b["compute"] == pytest.approx(40) and b["teardown"] == pytest.approx(20)
    # telemetry that finds more idle than the policy wins; nonsense (before the start) is clamped
    samples = tuple(Sample(T0 + t, 10, 0.0) for t in range(20, 100, 10)) * 2
    assert split(AttemptFacts(**{**f.__dict__, "samples": samples}))["idle"] == pytest.approx(160)  # T0+10..90
    assert split(AttemptFacts(**{**f.__dict__, "idle_from": T0 - 1e6}))["idle"] == pytest.approx(160)


def test_a_bare_jobs_first_gpu_activity_ends_its_startup_when_earlier():
    samples = (Sample(T0 + 10, 5, 0.0), Sample(T0 + 20, 10, 50.0))
    b = split(AttemptFacts(start=T0, end=T0 + 100, gpus=1, first_output_at=T0 + 40, samples=samples))
    assert b["startup"] == pytest.approx(10)  # activity in the period T0+10..T0+20


def test_a_bare_job_without_output_or_activity_starts_up_until_its_first_sample():
    samples = tuple(Sample(T0 + t, 10, 0.0) for t in (20, 30, 40))
    b = split(AttemptFacts(start=T0, end=T0 + 100, gpus=1, samples=samples))
    adds_up(b, 100)
    assert b["startup"] == pytest.approx(10)
    assert b["idle"] == pytest.approx(30)  # three idle samples of 10 s
    assert b["compute"] == pytest.approx(60)


def test_idle_samples_are_per_gpu_and_the_threshold_is_the_classes():
    samples = (Sample(T0 + 50, 50, 3.0), Sample(T0 + 50, 50, 8.0))  # two GPUs, 3% and 8%
    f = AttemptFacts(start=T0, end=T0 + 50, gpus=2, first_output_at=T0, samples=samples)
    assert split(f)["idle"] == pytest.approx(50)
    assert split(AttemptFacts(**{**f.__dict__, "idle_below": 10.0}))["idle"] == pytest.approx(100)


def test_nothing_allocated_is_all_zero():
    assert split(AttemptFacts(start=T0, end=T0 - 5, gpus=4)) == goodput.empty()
    assert split(AttemptFacts(start=float("nan"), end=T0, gpus=4)) == goodput.empty()
    assert split(AttemptFacts(start=T0, end=T0 + 5, gpus=0)) == goodput.empty()


# -- the property: they add up, exactly, whatever the input -------------------------------------------

times = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(T0 - 500, T0 + 1500), st.none(),
                  st.just("x"), st.integers(-10**20, 10**20))
durations = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(0, 2000), st.just(-3), st.none())


@st.composite
def files(draw: st.DrawFn, rank: int) -> dict:
    return {"v": 1, "attempt": 1, "rank": rank, "began": draw(st.one_of(st.floats(T0 - 500, T0 + 1500), times)),
            "last": draw(times), "phases": {k: draw(durations) for k in ("data_wait", "checkpoint_stall", "comm")},
            "after_last": {"checkpoint_stall": draw(durations)},
            "recent": [[i, draw(durations), 0] for i in range(draw(st.integers(0, 5)))]}


@st.composite
def facts(draw: st.DrawFn) -> AttemptFacts:
    n = draw(st.integers(0, 4))
    rs = tuple(r for i in range(n) if (r := parse_phases(draw(files(i)), 1, i)) is not None)
    samples = tuple(Sample(draw(st.floats(T0 - 100, T0 + 1200)), draw(st.floats(-1, 600)), draw(st.floats(-5, 150)))
                    for _ in range(draw(st.integers(0, 6))))
    opt = st.one_of(st.none(), st.floats(T0 - 500, T0 + 1500), st.just(float("nan")))
    return AttemptFacts(start=T0, end=T0 + draw(st.floats(0, 1000)), gpus=draw(st.integers(0, 16)),
                        lost_gpu_s=draw(st.one_of(st.floats(0, 1e6), st.just(float("nan")))),
                        stop_at=draw(opt), running=draw(st.booleans()), ranks=rs, first_output_at=draw(opt),
                        samples=samples, idle_below=draw(st.floats(0, 100)))


@settings(max_examples=examples(400), deadline=None)
@given(facts())
def test_the_buckets_add_up_to_the_allocated_gpu_seconds(f):
    b = split(f)
    total = f.gpus * (f.end - f.start)
    adds_up(b, total)
    lost = f.lost_gpu_s if f.lost_gpu_s == f.lost_gpu_s else 0.0
    assert b["recompute"] == pytest.approx(min(max(0.0, lost), max(0.0, total)), abs=1e-6)  # the lost work
