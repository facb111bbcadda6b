"""control/loop/usage_cache.py: the running decayed usage equals the full recomputation
(`snapshot.decayed_usage` over the same attempts) pass after pass, on a real store, as attempts
start, end (some committed late) and the clock moves on past re-anchoring."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import update

from trainyard.control.loop.snapshot import decayed_usage
from trainyard.control.loop.usage_cache import LATE_COMMIT_S, DecayedUsage
from trainyard.store.db import Store, open_store
from trainyard.store.models import AttemptRow, JobRow

DAY = 86400.0


@pytest.fixture
def store(tmp_path):
    st = open_store(f"sqlite:///{tmp_path / 'u.db'}")
    yield st
    st.close()


def add(store: Store, team: str, gpus: int, start: float, end: float | None) -> int:
    with store.session.begin() as s:
        j = JobRow(name="j", user="u", team=team, job_class="training", pool="default", state="RUNNING",
                   reason="None", command=["true"], workdir="/tmp", env={}, gpus=gpus, submit_time=start,
                   queued_since=start, attempt=1)
        s.add(j)
        s.flush()
        a = AttemptRow(job_id=j.id, attempt=1, placement=[], started_at=start, ended_at=end,
                       state="RUNNING" if end is None else "COMPLETED", gpus=gpus)
        s.add(a)
        s.flush()
        return a.id


def end(store: Store, aid: int, at: float) -> None:
    with store.session.begin() as s:
        s.execute(update(AttemptRow).where(AttemptRow.id == aid).values(ended_at=at, state="COMPLETED"))


def full(store: Store, now: float, since: float) -> dict[str, float]:
    """The recomputation over every attempt that ended after `since` (the cache's first read: it
    keeps what ended since then, where a recomputation at `now` would drop what is older than six
    half-lives, weighing at most 1/64)."""
    with store.session() as s:
        rows = s.query(JobRow.team, AttemptRow.gpus, AttemptRow.started_at, AttemptRow.ended_at).join(
            JobRow, JobRow.id == AttemptRow.job_id).filter(
            (AttemptRow.ended_at.is_(None)) | (AttemptRow.ended_at > since)).all()
    return decayed_usage(rows, now)


def cached(u: DecayedUsage, store: Store, now: float) -> dict[str, float]:
    with store.session() as s:
        return u(s, now)


def same(a: dict[str, float], b: dict[str, float]) -> None:
    assert set(a) == set(b)
    for k in a:
        assert a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-6), k


def test_the_running_sum_equals_the_recomputation_pass_after_pass(store):
    rng = random.Random(1)
    now = 1_800_000_000.0
    for _ in range(200):  # history: six weeks and more, some ended long ago
        a = now - rng.uniform(0, 60 * DAY)
        add(store, rng.choice("xyz"), rng.choice([1, 2, 8]), a, min(now - 1, a + rng.uniform(60, 3 * DAY)))
    u = DecayedUsage()
    since = now - 6 * 7 * DAY
    same(cached(u, store, now), full(store, now, since))  # the first read: six half-lives back
    running: list[int] = []
    for step in range(60):
        now += rng.uniform(1, 2 * DAY) if step % 10 == 0 else rng.uniform(1, 30)
        for _ in range(rng.randrange(3)):
            running.append(add(store, rng.choice("xyz"), rng.choice([1, 4]), now - rng.uniform(0, 100), None))
        for aid in list(running):
            if rng.random() < 0.3:
                # ended a little before now, committed now (the loop's reconcile runs behind)
                end(store, aid, now - rng.uniform(0, LATE_COMMIT_S / 2))
                running.remove(aid)
        same(cached(u, store, now), full(store, now, since))


def test_the_anchor_moves_on_and_the_figures_stay(store):
    now = 1_800_000_000.0
    add(store, "x", 2, now - DAY, now - DAY / 2)
    u = DecayedUsage()
    same(cached(u, store, now), full(store, now, now - 6 * 7 * DAY))
    later = now + 25 * 7 * DAY  # past REANCHOR_HALF_LIVES: read again from the store
    add(store, "y", 1, later - 3600, later - 60)
    same(cached(u, store, later), full(store, later, later - 6 * 7 * DAY))
    assert u.anchor == later
