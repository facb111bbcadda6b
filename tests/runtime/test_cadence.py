"""`CheckpointCadence`: asynchronous saves start early enough that no step boundary leaves more
than `every` steps uncommitted, whatever the commits take, and no earlier than they need to."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.runtime.cadence import CheckpointCadence
from tests.hypothesis_setup import examples


def simulate(every: int, lags: list[int], pipeline: int, steps: int = 60) -> tuple[list[int], int, list[int]]:
    """The loop of `Run.step_done` with one-second steps and commits that take `lags[i]` steps.

    Returns (saved steps, how many boundaries had to wait, the uncommitted span at each boundary).
    """
    c = CheckpointCadence(every, pipeline=pipeline)
    committed, in_flight, saves, waits, spans = 0, None, [], 0, []
    flags: list[bool] = []
    lag_of = iter(lags * (steps // max(1, len(lags)) + 2))
    for step in range(1, steps + 1):
        if in_flight is not None and step >= in_flight[1]:  # the commit finished during this step
            committed = in_flight[0]
            c.committed(float(in_flight[2]))
            in_flight = None
        c.step_ended(float(step))
        flags.append(c.due(step))
        agreed = flags[-1 - pipeline] if len(flags) > pipeline else False
        if c.should_save(step, agreed):
            if in_flight is not None:  # save() waits for the previous one first
                committed, in_flight = in_flight[0], c.committed(float(in_flight[2]))
            lag = next(lag_of)
            c.started(step)
            saves.append(step)
            in_flight = (step, step + lag, lag)  # (step, the step its commit lands in, seconds)
            if lag == 0:  # committed before the step ends
                committed, in_flight = step, c.committed(0.0)
        if in_flight is not None and c.must_wait(step, committed):
            waits += 1
            committed, in_flight = in_flight[0], c.committed(float(in_flight[2]))
        spans.append(step + 1 - committed)
    return saves, waits, spans


@given(every=st.integers(1, 12), lags=st.lists(st.integers(0, 15), min_size=1, max_size=8),
       pipeline=st.sampled_from([0, 1]))
@settings(max_examples=examples(300), deadline=None)
def test_no_boundary_leaves_more_than_every_steps_uncommitted(every, lags, pipeline):
    _, _, spans = simulate(every, lags, pipeline)
    assert max(spans) <= every


def test_commits_faster_than_a_step_keep_the_plain_multiples():
    saves, waits, _ = simulate(5, [0], pipeline=0, steps=30)
    assert saves == [5, 10, 15, 20, 25, 30] and waits == 0


def test_a_steady_two_step_commit_starts_each_save_two_steps_early_and_never_waits_after_the_first():
    saves, waits, spans = simulate(5, [2], pipeline=1, steps=40)
    assert saves[:4] == [5, 8, 11, 14] and max(spans) <= 5
    assert waits == 1  # the first commit: nothing is known about the lag yet


def test_every_must_be_positive():
    with pytest.raises(ValueError, match="checkpoint_every"):
        CheckpointCadence(0)
