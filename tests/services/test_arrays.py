"""`--array` read as sbatch reads it, and the `%N` throttle (services/arrays.py, pure)."""

import pytest

from trainyard.services.arrays import ArraySpec, normalize, parse, task_env, throttled


@pytest.mark.parametrize("text,indices,throttle,stored", [
    ("0-9", tuple(range(10)), None, "0-9"), ("1,3,5", (1, 3, 5), None, "1,3,5"),
    ("0-15:4", (0, 4, 8, 12), None, "0,4,8,12"), ("0-99%8", tuple(range(100)), 8, "0-99%8"),
    (" 7 ", (7,), None, "7"), ("3,1-2,2", (1, 2, 3), None, "1-3"), ("0-999", tuple(range(1000)), None, "0-999"),
])
def test_specs_are_read_and_stored_as_runs(text, indices, throttle, stored):
    spec = parse(text)
    assert spec == ArraySpec(indices, throttle) and normalize(spec) == stored


@pytest.mark.parametrize("text,words", [
    ("", "empty"), ("%4", "empty"), ("0-9%0", "from 1"), ("0-9%x", "from 1"), ("5-1", "goes up"),
    ("0-9:0", "step of at least 1"), ("a-b", "cannot read 'a-b'"), ("0-1000", "at most 1000"),
    ("0-1999:2,1", "at most 1000"), ("2000000", "up to 1000000"), ("1;2", "cannot read"),
])
def test_what_cannot_be_read_is_refused_naming_it(text, words):
    with pytest.raises(ValueError) as e:
        parse(text)
    assert words in str(e.value)


def test_each_task_sees_its_index_under_slurms_names_and_ours():
    env = task_env(42, 8, parse("0-15:4"))
    assert env["SLURM_ARRAY_JOB_ID"] == env["TRAINYARD_ARRAY_JOB_ID"] == "42"
    assert env["SLURM_ARRAY_TASK_ID"] == env["TRAINYARD_ARRAY_TASK_ID"] == "8"
    assert (env["SLURM_ARRAY_TASK_COUNT"], env["SLURM_ARRAY_TASK_MIN"], env["SLURM_ARRAY_TASK_MAX"]) == ("4", "0", "12")


@pytest.mark.parametrize("text,step", [("0-15:4", "4"), ("1-7:2", "2"), ("0-15:4,20", "4"), ("1,3,5", "1"), ("2-4", "1")])
def test_the_step_is_slurms(text, step):
    """What Slurm 22.05 sets SLURM_ARRAY_TASK_STEP to for the same --array (tried on the test cluster)."""
    assert task_env(1, parse(text).indices[0], parse(text))["SLURM_ARRAY_TASK_STEP"] == step


def test_the_throttle_lets_in_the_lowest_indices_up_to_its_room():
    waiting = [(15, 10, 5, 2), (12, 10, 2, 2), (13, 10, 3, 2), (21, 20, 0, 1), (22, 20, 1, 1)]
    assert throttled(waiting, {}) == {15, 22}  # array 10 lets in tasks 2 and 3; array 20 task 0
    assert throttled(waiting, {10: 1}) == {13, 15, 22}  # one running: room for one more (task 2)
    assert throttled(waiting, {10: 2, 20: 1}) == {12, 13, 15, 21, 22}  # full
    assert throttled(waiting, {10: 5}) == {12, 13, 15, 22}  # over (throttle lowered): none let in
