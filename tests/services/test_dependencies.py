"""`--dependency` read and judged as sbatch does (services/dependencies.py, pure)."""

import pytest

from trainyard.services.dependencies import Dependency, Target, job_ids, normalize, parse, verdict


def test_parts_kinds_and_ids_are_read_and_normalized():
    deps = parse(" AfterOK:12:13:12 , afterany:7,singleton")
    assert deps == [Dependency("afterok", (12, 13)), Dependency("afterany", (7,)), Dependency("singleton")]
    assert normalize(deps) == "afterok:12:13,afterany:7,singleton"
    assert job_ids(deps) == [7, 12, 13]


@pytest.mark.parametrize("text,words", [
    ("", "empty"), ("afterok", "needs job ids"), ("afterok:", "needs job ids"), ("afterok:x", "'x'"),
    ("afterok:0", "'0'"), ("afterok:-3", "'-3'"), ("afterok:١", "'١'"), ("aftercorr:1", "unknown dependency kind"),
    ("12", "unknown dependency kind '12'"), ("afterok:1?afterany:2", "'?' (any one of) is not supported"),
    ("singleton:4", "takes no job ids"), ("afterok:1+5", "delays"), ("afterok:" + ":".join(["1"] * 1001), "at most"),
])
def test_what_cannot_be_read_is_refused_naming_it(text, words):
    with pytest.raises(ValueError) as e:
        parse(text)
    assert words in str(e.value)


RUNNING, PENDING = Target("RUNNING", True), Target("PENDING", False)
OK, FAILED, CANCELLED_UNSTARTED = Target("COMPLETED", True), Target("FAILED", True), Target("CANCELLED", False)


@pytest.mark.parametrize("kind,target,want", [
    ("after", PENDING, "wait"), ("after", RUNNING, "met"), ("after", CANCELLED_UNSTARTED, "met"),
    ("afterany", RUNNING, "wait"), ("afterany", OK, "met"), ("afterany", FAILED, "met"),
    ("afterok", RUNNING, "wait"), ("afterok", OK, "met"), ("afterok", FAILED, "never"),
    ("afterok", CANCELLED_UNSTARTED, "never"),
    ("afternotok", RUNNING, "wait"), ("afternotok", FAILED, "met"), ("afternotok", OK, "never"),
    ("afternotok", Target("TIMEOUT", True), "met"), ("afternotok", Target("REQUEUED", True), "wait"),
])
def test_each_kind_means_what_it_means_in_slurm(kind, target, want):
    assert verdict([Dependency(kind, (5,))], {5: target}, None)[0] == want


def test_all_parts_must_hold_and_one_that_never_can_decides():
    deps = parse("afterok:1:2,afterany:3")
    assert verdict(deps, {1: OK, 2: OK, 3: FAILED}, None) == ("met", "")
    assert verdict(deps, {1: OK, 2: RUNNING, 3: FAILED}, None) == ("wait", "job 2 has not completed")
    assert verdict(deps, {1: OK, 2: OK, 3: RUNNING}, None) == ("wait", "job 3 has not ended")
    v, why = verdict(deps, {1: RUNNING, 2: FAILED, 3: RUNNING}, None)
    assert v == "never" and why == "afterok:2 can never be met: job 2 is FAILED"
    assert verdict(deps, {1: OK, 3: OK}, None)[0] == "never"  # a job that does not exist never ends


def test_singleton_waits_for_the_earlier_job_of_its_name_and_user():
    assert verdict(parse("singleton"), {}, None) == ("met", "")
    assert verdict(parse("singleton"), {}, 4) == ("wait", "singleton: job 4 of the same name and user has not ended")
    assert verdict(parse("afterok:1,singleton"), {1: OK}, 4)[0] == "wait"
