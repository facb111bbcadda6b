"""The pids limit in the configuration (issue 34 point 4): per class, overridden per team, a
built-in default, and bounds that name the field (spec/models.py, spec/bounds.py)."""

from __future__ import annotations

import pytest

from tests.plane import TWO_TEAMS
from trainyard.spec import bounds as spec_bounds
from trainyard.spec.models import DEFAULT_PIDS_MAX, ConfigError, parse_config


def with_pids(cls: str | None = None, team: str | None = None) -> str:
    text = TWO_TEAMS.read_text()
    if cls is not None:
        text = text.replace("grace_period: 0}", f"grace_period: 0, pids_max: {cls}}}")
    if team is not None:
        text = text.replace("  - name: nlp\n", f"  - name: nlp\n    pids_max: {team}\n")
    return text


def test_the_team_wins_over_the_class_which_wins_over_the_built_in_default():
    spec = parse_config(with_pids(cls="256", team="1024"))
    assert spec.pids_max_for("vision", "interactive") == 256  # the class's
    assert spec.pids_max_for("nlp", "interactive") == 1024  # the team's, over the class's
    assert spec.pids_max_for("nlp", "training") == 1024
    assert spec.pids_max_for("vision", "training") == DEFAULT_PIDS_MAX == 4096
    assert spec.pids_max_for("gone", "gone") == DEFAULT_PIDS_MAX  # no longer configured: the default


@pytest.mark.parametrize("cls, team, field, says", [
    ("8", None, "classes.0.pids_max", "greater than or equal to 16"),
    ("5000000", None, "classes.0.pids_max", "less than or equal to 4194304"),
    ("'4096'", None, "classes.0.pids_max", "valid integer"),
    ("true", None, "classes.0.pids_max", "valid integer"),
    ("64.5", None, "classes.0.pids_max", "valid integer"),
    (None, "-1", "teams.1.pids_max", "greater than or equal to 16"),
    (None, "[1]", "teams.1.pids_max", "valid integer"),
])
def test_a_malformed_pids_limit_names_its_field_and_line(cls, team, field, says):
    with pytest.raises(ConfigError, match=says) as e:
        parse_config(with_pids(cls, team))
    assert e.value.field == field and e.value.line is not None


def test_the_bounds_are_what_a_job_needs_to_start_and_the_kernels_own_ceiling():
    assert parse_config(with_pids(cls=str(spec_bounds.MIN_PIDS_MAX))).pids_max_for("vision", "interactive") == 16
    assert parse_config(with_pids(team=str(spec_bounds.MAX_PIDS_MAX))).pids_max_for("nlp", "x") == 4_194_304
