"""`yard teams set` changes only what it is told, and keeps the configuration's comments (issue 17,
item 5); quotas that promise more GPUs than a pool has are stored with a warning. Real `yard`
processes against a real `yard up` started on a commented configuration."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.cli.yard_process import yard_process
from tests.plane import FIXTURES

CONFIG = FIXTURES / "commented_teams.yaml"
COMMENTS = [line.split("#", 1)[1] for line in CONFIG.read_text().splitlines() if "#" in line]


# One worker for this module's tests under `make test`'s --dist loadgroup: its module-scoped
# yard up starts once, not once per worker (about 4 s of CPU each).
pytestmark = pytest.mark.xdist_group("cli-teams-set")


@pytest.fixture(scope="module")
def yard(tmp_path_factory):
    yield from yard_process(tmp_path_factory, "teams", config_file=CONFIG)


def stored(yard) -> tuple[int, str]:
    v = json.loads(yard("cluster", "get", "--json").stdout)
    return v["version"], v["text"]


def quota(text: str, team: str, pool: str = "default") -> dict:
    return next(t for t in yaml.safe_load(text)["teams"] if t["name"] == team)["quotas"][pool]


def changed_lines(yard, a: int, b: int) -> list[str]:
    d = json.loads(yard("cluster", "diff", str(a), str(b), "--json").stdout)["diff"]
    return [line for line in d.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def step_nominal_alone_keeps_the_limits_and_every_comment(yard):
    before, text = stored(yard)
    assert quota(text, "speech") == {"nominal": 4, "borrowing_limit": 2, "lending_limit": 4}
    p = yard("teams", "set", "speech", "--nominal", "3", "-m", "grant cut")
    assert p.stdout.startswith("team speech: updated") and p.stderr == ""
    after, text = stored(yard)
    assert after == before + 1
    assert quota(text, "speech") == {"nominal": 3, "borrowing_limit": 2, "lending_limit": 4}
    assert all(c in text for c in COMMENTS), text
    assert changed_lines(yard, before, after) == ["-        nominal: 4  # the grant", "+        nominal: 3  # the grant"]
    shown = {t["name"]: t for t in json.loads(yard("teams", "--json").stdout)}
    assert shown["speech"]["quotas"]["default"]["borrowing_limit"] == 2
    assert shown["vision"]["quotas"]["default"] == {"nominal": 4, "borrowing_limit": 4, "lending_limit": None}


def step_a_limit_can_be_changed_or_removed_alone(yard):
    before, _ = stored(yard)
    yard("teams", "set", "vision", "--borrowing-limit", "2")
    yard("teams", "set", "speech", "--lending-limit", "none")
    after, text = stored(yard)
    assert quota(text, "vision") == {"nominal": 4, "borrowing_limit": 2}
    assert quota(text, "speech") == {"nominal": 3, "borrowing_limit": 2}
    assert all(c in text for c in COMMENTS)
    assert "      default: {nominal: 4, borrowing_limit: 2}" in text  # the flow mapping stays one
    assert len(changed_lines(yard, before, after)) == 3  # vision's line, and speech's lending line gone


def step_quotas_beyond_the_pool_are_stored_with_a_warning(yard):
    p = yard("teams", "set", "vision", "--nominal", "6")
    assert "warning: pool 'default': nominal quotas add up to 9 GPUs, more than its 8" in p.stderr
    assert quota(stored(yard)[1], "vision")["nominal"] == 6
    p = yard("teams", "set", "vision", "--nominal", "4")
    assert "warning" not in p.stderr and quota(stored(yard)[1], "vision")["nominal"] == 4


def step_cluster_apply_warns_too(yard, tmp_path):
    _, text = stored(yard)
    f = tmp_path / "over.yaml"
    f.write_text(text.replace("nominal: 3  # the grant", "nominal: 7  # the grant"))
    p = yard("cluster", "apply", str(f))
    assert "warning: pool 'default': nominal quotas add up to 11 GPUs, more than its 8" in p.stderr
    yard("teams", "set", "speech", "--nominal", "3")


def test_one_configuration_changed_in_turn(yard, tmp_path):
    """The steps above, each from where the last left the configuration: one test, so that no
    test runner (xdist splits a module's tests across workers) can run them apart or out of order."""
    step_nominal_alone_keeps_the_limits_and_every_comment(yard)
    step_a_limit_can_be_changed_or_removed_alone(yard)
    step_quotas_beyond_the_pool_are_stored_with_a_warning(yard)
    step_cluster_apply_warns_too(yard, tmp_path)


@pytest.mark.parametrize("args, words", [
    (["speech"], "give what to change"),
    (["speech", "--borrowing-limit", "lots"], "--borrowing-limit: expected a number of GPUs or 'none', got 'lots'"),
    (["speech", "--nominal", "-1"], "--nominal"),
    (["nobody", "--nominal", "1"], "no team 'nobody'"),
    (["speech", "--pool", "a100", "--borrowing-limit", "1"], "nominal"),  # a new pool's quota needs one
    (["speech", "--pool", "a100", "--nominal", "1"], "unknown pool 'a100'"),
    (["speech", "--colour", "red"], "--colour"),
])
def test_bad_input_exits_2_naming_it_and_stores_nothing(yard, args, words):
    before = stored(yard)
    p = yard("teams", "set", *args, ok=False)
    assert p.returncode == 2 and words in p.stderr, p.stderr
    assert stored(yard) == before
