"""The `stragglers:` section (spec/stragglers.py): defaults when absent, values as written, and each
malformed value an error naming the file, line and field; a real `yard cluster apply` of one exits 2
and stores no new version."""

from __future__ import annotations

import json

import pytest

from tests.cli.yard_process import yard_process
from tests.plane import TWO_TEAMS
from trainyard.spec.models import parse_config
from trainyard.spec.parsing import ConfigError

BASE = TWO_TEAMS.read_text()

pytestmark = pytest.mark.xdist_group("spec-stragglers-config")


def test_absent_is_on_with_the_defaults_and_written_values_read_as_written() -> None:
    s = parse_config(BASE, "cluster.yaml").stragglers
    assert (s.enabled, s.factor, s.window, s.suspect_window) == (True, 1.5, 10, 3600.0)
    s = parse_config(BASE + "stragglers: {factor: 2, window: 20, suspect_window: 30m, enabled: false}\n").stragglers
    assert (s.enabled, s.factor, s.window, s.suspect_window) == (False, 2.0, 20, 1800.0)


@pytest.mark.parametrize("bad, field, words", [
    ("{factor: 1}", "stragglers.factor", ["greater than 1"]),
    ("{factor: .nan}", "stragglers.factor", ["finite"]),
    ("{window: 2}", "stragglers.window", ["greater than or equal to 3"]),
    ("{window: 33}", "stragglers.window", ["less than or equal to 32"]),  # a phase file keeps 32 steps
    ("{window: 10.5}", "stragglers.window", ["integer"]),
    ("{suspect_window: 0}", "stragglers.suspect_window", ["greater than 0"]),
    ("{suspect_window: soon}", "stragglers.suspect_window", ["soon"]),
    ("{enabled: maybe}", "stragglers.enabled", ["boolean"]),
    ("{factr: 2}", "stragglers.factr", ["Extra inputs"]),
])
def test_a_malformed_value_is_an_error_naming_the_field(bad: str, field: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(BASE + f"stragglers: {bad}\n", "cluster.yaml")
    assert e.value.field == field, str(e.value)
    assert e.value.file == "cluster.yaml" and e.value.line == BASE.count("\n") + 1, str(e.value)
    for w in words:
        assert w in str(e.value), str(e.value)


@pytest.fixture(scope="module")
def yard(tmp_path_factory):
    config = tmp_path_factory.mktemp("stragglers-config") / "cluster.yaml"
    config.write_text(BASE)
    yield from yard_process(tmp_path_factory, "stragglers", config_file=config)


def test_yard_cluster_apply_of_a_bad_section_exits_2_naming_it_and_stores_nothing(yard, tmp_path) -> None:
    versions = len(json.loads(yard("cluster", "history", "--json").stdout))
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE + "stragglers: {factor: 0.5}\n")
    p = yard("cluster", "apply", str(bad), ok=False)
    assert p.returncode == 2 and "stragglers.factor" in p.stderr and "greater than 1" in p.stderr, p.stderr
    assert len(json.loads(yard("cluster", "history", "--json").stdout)) == versions
    good = tmp_path / "good.yaml"
    good.write_text(BASE + "stragglers: {factor: 2}\n")
    yard("cluster", "apply", str(good))
    assert len(json.loads(yard("cluster", "history", "--json").stdout)) == versions + 1
