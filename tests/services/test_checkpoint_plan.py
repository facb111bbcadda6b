"""The pure plan of a job's checkpoints (services/checkpoint_plan.py): the issue's example, and
properties over any steps, marks and rules (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.services.checkpoint_plan import ARCHIVE, FAST, Checkpoint, plan
from trainyard.spec.lifecycle import CheckpointRules, KeepBest


def cps(steps, keep=(), archived=(), metrics=None):  # noqa: ANN001, ANN201
    return [Checkpoint(s, frozenset({FAST} | ({ARCHIVE} if s in archived else set())),
                       (metrics or {}).get(s), s in keep) for s in steps]


def test_keep_last_2_and_every_5th_of_10_checkpoints():
    """The reading the acceptance uses: fast {9, 10}, archive {5}, the rest deleted."""
    p = plan(cps(range(1, 11)), CheckpointRules(keep_last=2, keep_every=5), archive_tier=True, ended_at=None, now=0)
    assert p.fast == {9, 10} and p.archive == {5} and p.delete == {1, 2, 3, 4, 6, 7, 8}
    assert p.moves(cps(range(1, 11))) == [5]
    assert p.fast_removals(cps(range(1, 11), archived={5})) == [5]


def test_without_an_archive_what_would_be_archived_stays_fast():
    p = plan(cps(range(1, 11)), CheckpointRules(keep_last=2, keep_every=5), archive_tier=False, ended_at=None, now=0)
    assert p.fast == {5, 9, 10} and p.archive == set() and p.delete == {1, 2, 3, 4, 6, 7, 8}


def test_keep_best_by_the_manifest_metric_and_marks():
    metrics = {s: {"loss": 10.0 - s if s != 3 else 0.5} for s in range(1, 9)}
    p = plan(cps(range(1, 9), keep={1}, metrics=metrics),
             CheckpointRules(keep_last=2, keep_best=KeepBest(metric="loss", mode="min", count=1)),
             archive_tier=True, ended_at=None, now=0)
    assert p.fast == {1, 7, 8} and p.archive == {3}


def test_keep_for_after_the_end_leaves_only_marked_steps():
    p = plan(cps(range(1, 6), keep={2}), CheckpointRules(keep_last=2, keep_for=10), archive_tier=True,
             ended_at=100.0, now=111.0)
    assert p.fast == {2} and p.archive == set() and p.delete == {1, 3, 4, 5}
    early = plan(cps(range(1, 6), keep={2}), CheckpointRules(keep_last=2, keep_for=10), archive_tier=True,
                 ended_at=100.0, now=105.0)
    assert 5 in early.fast


def _rules(**kw):  # noqa: ANN003, ANN202 - a field given as None is left unset (as a configuration omits it)
    return CheckpointRules(**{k: v for k, v in kw.items() if v is not None})


rules_st = st.builds(_rules, keep_last=st.none() | st.integers(1, 5), keep_every=st.none() | st.integers(1, 7),
                     keep_best=st.none() | st.builds(KeepBest, metric=st.just("loss"),
                                                     mode=st.sampled_from(["min", "max"]), count=st.integers(1, 3)),
                     keep_for=st.none() | st.floats(0, 100))


@settings(max_examples=300, deadline=None)
@given(steps=st.sets(st.integers(0, 60), max_size=25), marks=st.sets(st.integers(0, 60), max_size=5),
       rules=rules_st, archive=st.booleans(), ended=st.none() | st.floats(0, 100), now=st.floats(0, 300),
       losses=st.dictionaries(st.integers(0, 60), st.floats(-5, 5), max_size=25))
def test_the_plan_partitions_the_steps_and_never_drops_what_runs_or_is_marked(steps, marks, rules, archive, ended, now,
                                                                              losses):
    c = [Checkpoint(s, frozenset({FAST}), {"loss": losses[s]} if s in losses else None, s in marks) for s in steps]
    p = plan(c, rules, archive_tier=archive, ended_at=ended, now=now)
    assert p.fast | p.archive | p.delete == set(steps)
    assert not (p.fast & p.archive) and not (p.fast & p.delete) and not (p.archive & p.delete)
    assert (marks & set(steps)) <= p.fast  # a marked step stays fast, whatever the rules
    if not archive:
        assert not p.archive
    expired = rules.keep_for is not None and ended is not None and now >= ended + rules.keep_for
    if steps and not expired:
        newest = sorted(steps)[-(rules.keep_last or 3):]
        assert set(newest) <= p.fast  # the newest keep_last, the newest of all among them
    if expired:
        assert p.fast == marks & set(steps) and not p.archive
