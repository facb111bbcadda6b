"""Bounds on configuration text and values (`spec/bounds.py`) and the `limits:` section
(`spec/limits.py`): what is refused, with which line and field, and what a real config keeps."""

from __future__ import annotations

import time

import pytest

from tests.plane import TWO_TEAMS
from trainyard.spec import bounds as spec_bounds
from trainyard.spec.models import EXAMPLE_CONFIG, ConfigError, parse_config


def test_the_shipped_configs_are_within_every_bound():
    for text in (EXAMPLE_CONFIG.read_text(), TWO_TEAMS.read_text()):
        spec_bounds.check_yaml(text, "x")
        parse_config(text)


def test_depth_counts_what_an_alias_brings_in():
    deep = "[" * 20 + "1" + "]" * 20
    spec_bounds.check_yaml(f"a: &a {deep}\nb: {deep}\n", "x")  # 21 levels each: fine
    with pytest.raises(ConfigError, match="nested more than 32 levels deep") as e:
        spec_bounds.check_yaml(f"a: &a {deep}\nb: " + "[" * 15 + "*a" + "]" * 15 + "\n", "f.yaml")
    assert e.value.file == "f.yaml" and e.value.line == 2


def test_a_billion_laughs_is_refused_before_it_is_built():
    text = "a: &a [1,2,3,4,5,6,7,8,9,10]\n" + "".join(
        f"{x}: &{x} [{', '.join(['*' + p] * 10)}]\n" for p, x in zip("abcdefgh", "bcdefghi"))
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="more than 200000 values"):
        parse_config(text)
    assert time.monotonic() - t0 < 2


def test_a_typo_of_zeros_is_refused_before_any_node_is_built():
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        parse_config(TWO_TEAMS.read_text().replace("count: 2", "count: 100000000"))
    assert e.value.field == "cluster.nodes.0.count" and e.value.line == 6 and time.monotonic() - t0 < 2


@pytest.mark.parametrize("old, new, field", [
    ("gpu_mem_gb: 16", "gpu_mem_gb: 1e9", "cluster.nodes.0.gpu_mem_gb"),
    ("nominal: 4", "nominal: 10000000", "teams.0.quotas.default.nominal"),
    ("max_wait: 15m", "max_wait: 99999999999", "classes.0.max_wait"),
    ("grace_period: 0", "grace_period: .nan", "classes.0.grace_period"),
])
def test_values_beyond_their_bounds_name_the_field(old, new, field):
    text = TWO_TEAMS.read_text()
    assert old in text
    with pytest.raises(ConfigError) as e:
        parse_config(text.replace(old, new, 1))
    if field:
        assert e.value.field == field


def test_limits_resolve_user_then_team_then_default_then_built_in():
    spec = parse_config(TWO_TEAMS.read_text() + """
limits:
  default: {max_submit_jobs: 100, max_script_size: 2M}
  teams:
    vision: {max_submit_jobs: 10, grp_submit_jobs: 50, max_env_size: 64KiB}
  users:
    alice: {max_submit_jobs: 3}
""").limits
    got = spec.effective("alice", "vision")
    assert got["max_submit_jobs"] == (3, "limits.users.alice")
    assert got["grp_submit_jobs"] == (50, "limits.teams.vision")
    assert got["max_env_size"] == (64 << 10, "limits.teams.vision")
    assert got["max_script_size"] == (2 << 20, "limits.default")
    assert got["max_env_vars"] == (1000, "built-in")
    assert spec.effective("bob", "nlp")["max_submit_jobs"] == (100, "limits.default")
    assert spec.effective("bob", "nlp")["grp_submit_jobs"] == (None, "built-in")


@pytest.mark.parametrize("section, words", [
    ("  users:\n    bob: {grp_submit_jobs: 3}\n", "a team's total"),
    ("  teams:\n    nobody: {max_submit_jobs: 1}\n", "no team 'nobody'"),
    ("  default: {max_env_size: lots}\n", "cannot read 'lots' as a size"),
    ("  default: {max_env_size: 3G}\n", "less than or equal to 2097152"),
    ("  default: {MaxSubmitJobs: 3}\n", "Extra inputs are not permitted"),
    ("  default: {max_array_size: 0}\n", "greater than or equal to 1"),
])
def test_bad_limits_are_refused_naming_them(section, words):
    with pytest.raises(ConfigError, match=words):
        parse_config(TWO_TEAMS.read_text() + "limits:\n" + section)
