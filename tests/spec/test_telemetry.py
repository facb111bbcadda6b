"""`telemetry:` in the configuration (spec/telemetry.py): the defaults, durations as elsewhere, and every
malformed value refused naming its field (issue 39, per-GPU telemetry)."""

from __future__ import annotations

import pytest

from tests.plane import TWO_TEAMS
from trainyard.spec.models import ConfigError, parse_config


def test_defaults_and_durations():
    bare = parse_config(TWO_TEAMS.read_text()).telemetry
    assert (bare.enabled, bare.interval, bare.flush, bare.max_rows_per_job) == (True, 1.0, 15.0, 2000)
    t = parse_config(TWO_TEAMS.read_text() + "telemetry: {interval: 2s, flush: 1m, max_rows_per_job: 100, "
                     "enabled: false}\n").telemetry
    assert (t.enabled, t.interval, t.flush, t.max_rows_per_job) == (False, 2.0, 60.0, 100)


@pytest.mark.parametrize("section, field", [
    ("telemetry: 5", "telemetry"),
    ("telemetry: {interval: 0}", "telemetry.interval"),
    ("telemetry: {interval: soon}", "telemetry.interval"),
    ("telemetry: {interval: 2h}", "telemetry.interval"),
    ("telemetry: {flush: -1}", "telemetry.flush"),
    ("telemetry: {max_rows_per_job: 5}", "telemetry.max_rows_per_job"),
    ("telemetry: {max_rows_per_job: '2000'}", "telemetry.max_rows_per_job"),
    ("telemetry: {enabled: perhaps}", "telemetry.enabled"),
    ("telemetry: {every: 1s}", "telemetry.every"),
    ("telemetry: {interval: 30s, flush: 10s}", "telemetry"),
])
def test_a_malformed_telemetry_section_is_refused_naming_the_field(section, field):
    with pytest.raises(ConfigError) as e:
        parse_config(TWO_TEAMS.read_text() + section + "\n")
    assert e.value.field == field, str(e.value)
    if field == "telemetry" and "flush" in section:
        assert "telemetry.flush" in str(e.value)
