"""The scheduler section as versioned configuration (services/config.py), on a real SQLite store:
apply/history/diff/rollback cover it, `ConfigVersion.policy` is built once per version, and
`set_policy` (what `yard up --policy` does) is a new version with only the policy changed."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import yaml

from trainyard.sched.engine import EngineParams
from trainyard.services import config
from trainyard.services.auth import Principal
from trainyard.services.errors import ServiceError
from trainyard.store.db import Store, open_store, sqlite_url

FIXTURE = Path(__file__).parent.parent / "fixtures" / "two_teams.yaml"
ADMIN = Principal("root", "admin")
TUNED = FIXTURE.read_text() + ("\n# tuned for short jobs\nscheduler:\n  policy: trainyard  # ours\n  params:\n"
                               "    max_reservations: 1\n    ordering:\n      reserve_at: 0.2\n  # end\n")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    st = open_store(sqlite_url(tmp_path))
    try:
        yield st
    finally:
        st.close()


def current(st: Store, cache: config.ConfigCache | None = None) -> config.ConfigVersion:
    with st.session() as s:
        return (cache or config.ConfigCache()).current(s)


def test_the_policy_is_versioned_with_the_rest(store):
    with store.session.begin() as s:
        config.apply(s, FIXTURE.read_text(), ADMIN, "first")
    cache = config.ConfigCache()
    v1 = current(store, cache)
    assert v1.policy.name == "trainyard" and v1.policy.params == EngineParams()
    assert v1.policy is v1.policy  # built once per version: every loop pass reads it
    with store.session.begin() as s:
        assert config.apply(s, TUNED, ADMIN, "tune") == 2
    v2 = current(store, cache)
    assert v2.version == 2 and v2.policy.params.max_reservations == 1
    assert v2.policy.params.ordering.reserve_at == 0.2
    with store.session() as s:
        assert [h["message"] for h in config.history(s)] == ["tune", "first"]
        d = config.diff(s, 1, 2)
    assert "+scheduler:" in d and "+    max_reservations: 1" in d
    with store.session.begin() as s:
        assert config.rollback(s, 1, ADMIN) == 3
    assert current(store, cache).policy.params == EngineParams()


def test_a_bad_section_is_refused_and_nothing_is_stored(store):
    with store.session.begin() as s:
        config.apply(s, FIXTURE.read_text(), ADMIN)
    bad = FIXTURE.read_text() + "scheduler:\n  params:\n    ordering:\n      reserve_at: -1\n"
    with pytest.raises(ServiceError) as e, store.session.begin() as s:
        config.apply(s, bad, ADMIN)
    assert e.value.field == "scheduler.params.ordering.reserve_at" and "config:24" in str(e.value)
    assert current(store).version == 1


def test_set_policy_stores_a_version_with_only_the_policy_changed(store):
    with store.session.begin() as s:
        config.apply(s, TUNED, ADMIN)
        assert config.set_policy(s, "trainyard", ADMIN, "yard up --policy trainyard") is None  # already
        assert config.set_policy(s, "fifo", ADMIN, "yard up --policy fifo") == (2, True)
    with store.session() as s:
        row = config.get_version(s)
        assert (row.author, row.message) == ("root", "yard up --policy fifo")
        d = config.diff(s, 1, 2)
    assert current(store).policy.name == "fifo"
    removed = [ln[1:] for ln in d.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    added = [ln[1:] for ln in d.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    # the trainyard parameters go (they are not fifo's), the comments stay, nothing else moves
    assert added == ["  policy: fifo  # ours"]
    assert removed == ["  policy: trainyard  # ours", "  params:", "    max_reservations: 1", "    ordering:",
                       "      reserve_at: 0.2"]
    with store.session.begin() as s:
        assert config.set_policy(s, "tiresias", ADMIN, "again") == (3, False)  # fifo had no parameters


def test_the_text_given_to_yard_up_takes_the_flags_policy():
    text = FIXTURE.read_text()
    assert config.given_text(text, None) == (text, "configuration given to yard up")
    assert config.given_text(text, "trainyard") == (text, "configuration given to yard up")  # already its policy
    out, why = config.given_text(TUNED, "slurm")
    assert why == "configuration given to yard up, scheduler.policy from yard up --policy slurm"
    assert yaml.safe_load(out)["scheduler"] == {"policy": "slurm"}
    with pytest.raises(ServiceError):
        config.given_text(text + "scheduler: {policy: nope}\n", "fifo")


@pytest.mark.parametrize("text,want", [
    ("a: 1\n", "a: 1\nscheduler:\n  policy: fifo\n"),
    ("a: 1", "a: 1\nscheduler:\n  policy: fifo\n"),
    ("scheduler:\n  params:\n    max_reservations: 2\nb: 2\n", "scheduler:\n  policy: fifo\nb: 2\n"),
    ("# top\nscheduler:\n  # which\n  policy: slurm\n  params: {w_age: 1}\n",
     "# top\nscheduler:\n  # which\n  policy: fifo\n"),
])
def test_with_policy_edits_the_text_in_place(text, want):
    assert config.with_policy(text, "fifo") == want


def test_with_policy_falls_back_to_the_data_where_the_layout_is_not_plain():
    out = config.with_policy("scheduler: {policy: slurm, params: {w_age: 1}}\nb: [1]\n", "fifo")
    assert yaml.safe_load(out) == {"scheduler": {"policy": "fifo"}, "b": [1]}
