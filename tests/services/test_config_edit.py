"""Edits of the stored configuration text (services/config_edit.py): only what is named changes."""

from __future__ import annotations

import pytest
import yaml

from tests.plane import FIXTURES, TWO_TEAMS
from trainyard.services.config_edit import edit_team
from trainyard.services.errors import NotFound

COMMENTED = (FIXTURES / "commented_teams.yaml").read_text()


def test_a_patch_changes_one_field_and_keeps_comments_and_layout():
    out = edit_team(COMMENTED, "speech", quotas={"default": {"nominal": 3}})
    assert out == COMMENTED.replace("nominal: 4  # the grant", "nominal: 3  # the grant")


def test_a_put_replaces_the_named_pools_whole():
    out = edit_team(COMMENTED, "speech", quotas={"default": {"nominal": 2}}, replace=True)
    assert yaml.safe_load(out)["teams"][0]["quotas"] == {"default": {"nominal": 2}}
    assert "# speech: funded for 4 GPUs until March" in out and "# the big one" in out


def test_cohort_set_and_removed_and_a_pool_removed():
    out = edit_team(TWO_TEAMS.read_text(), "nlp", cohort="solo", quotas={"default": None})
    nlp = yaml.safe_load(out)["teams"][1]
    assert nlp["cohort"] == "solo" and nlp["quotas"] == {}
    assert "cohort" not in yaml.safe_load(edit_team(TWO_TEAMS.read_text(), "nlp", cohort=""))["teams"][1]


def test_either_sequence_indentation_is_kept():
    flush = COMMENTED.replace("\n  - ", "\n- ").replace("\n    ", "\n  ")  # `teams:\n- name:` style
    assert yaml.safe_load(flush) == yaml.safe_load(COMMENTED)
    out = edit_team(flush, "speech", quotas={"default": {"borrowing_limit": 3}})
    assert out == flush.replace("borrowing_limit: 2  #", "borrowing_limit: 3  #")


def test_an_unknown_team_is_not_found():
    with pytest.raises(NotFound):
        edit_team(COMMENTED, "nobody", quotas={"default": {"nominal": 1}})
