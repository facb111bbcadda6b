"""A class's `idle:` (spec/idle.py): a well-formed one reads as written, with its defaults; the old
`idle_timeout` reads as its allocations-only form; each malformed one is an error naming the file,
the line and the field; a real `yard up --config` with one exits 2 and writes nothing (and
`yard cluster apply`: tests/cli/test_idle_yard_up.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.plane import TWO_TEAMS, YARD
from trainyard.spec.idle import policies
from trainyard.spec.models import parse_config
from trainyard.spec.parsing import ConfigError

BASE = TWO_TEAMS.read_text()
LINE = "  - {name: batch, priority: 100, preemptible: true, max_wait: 3d, min_run_time: 0, grace_period: 2}"
assert LINE in BASE


def config(idle: str, extra: str = ""):
    """TWO_TEAMS with the batch class given `idle` (YAML flow text of its value)."""
    return parse_config(BASE.replace(LINE, LINE[:-1] + f", idle: {idle}}}") + extra, "cluster.yaml")


def test_an_idle_policy_reads_as_written_with_defaults_for_the_rest() -> None:
    spec = config("{after: 30m, below: 2.5%, action: requeue, warning: 2m, exempt_teams: [nlp], max_requeues: 3}")
    pol = policies(spec)["batch"]
    assert (pol.after, pol.below, pol.action, pol.warning, pol.exempt_teams, pol.max_requeues) == \
        (1800, 2.5, "requeue", 120, frozenset({"nlp"}), 3)
    assert not pol.allocations_only
    d = policies(config("{after: 1m}"))["batch"]
    assert (d.below, d.action, d.warning, d.exempt_teams, d.max_requeues) == (5, "notify", 30, frozenset(), 1)
    assert policies(config("{after: 2h, below: 7}"))["batch"].warning == 60  # a minute, at most half of after
    assert policies(config("{after: 1m, below: '0.5 %', warning: 0}"))["batch"].below == 0.5
    assert set(policies(config("{after: 1m}"))) == {"batch"}  # the other classes have none


def test_the_old_idle_timeout_is_its_allocations_only_form() -> None:
    spec = parse_config(BASE.replace(LINE, LINE[:-1] + ", idle_timeout: 1h}")
                        + "interactive: {idle_cpu_percent: 3, idle_warning: 5m}\n")
    pol = policies(spec)["batch"]
    assert (pol.after, pol.below, pol.action, pol.warning, pol.allocations_only) == (3600, 3, "cancel", 300, True)


@pytest.mark.parametrize("idle, field, words", [
    ("{below: 5%}", "classes.2.idle.after", ["Field required"]),
    ("{after: soon}", "classes.2.idle.after", ["cannot read 'soon' as a duration"]),
    ("{after: 0}", "classes.2.idle.after", ["greater than 0"]),
    ("{after: 1m, below: 5 percent}", "classes.2.idle.below", ["cannot read '5 percent' as a percent"]),
    ("{after: 1m, below: 0}", "classes.2.idle.below", ["greater than 0"]),
    ("{after: 1m, below: 150%}", "classes.2.idle.below", ["less than or equal to 100"]),
    ("{after: 1m, below: yes}", "classes.2.idle.below", ["a percent must be a number"]),
    ("{after: 1m, action: kill}", "classes.2.idle.action", ["'notify', 'requeue' or 'cancel'"]),
    ("{after: 1m, warning: 1m}", "classes.2.idle", ["idle.warning (60 s) must be shorter than idle.after (60 s)"]),
    ("{after: 1m, warning: -5}", "classes.2.idle.warning", ["cannot be negative"]),
    ("{after: 1m, max_requeues: -1}", "classes.2.idle.max_requeues", ["greater than or equal to 0"]),
    ("{after: 1m, exempt_teams: nlp}", "classes.2.idle.exempt_teams", ["valid list"]),
    ("{after: 1m, grace: 5}", "classes.2.idle.grace", ["Extra inputs"]),
    ("30m", "classes.2.idle", ["valid dictionary"]),
])
def test_a_malformed_idle_policy_is_an_error_naming_the_file_line_and_field(idle, field, words) -> None:
    with pytest.raises(ConfigError) as e:
        config(idle)
    assert e.value.field == field, str(e.value)
    assert e.value.file == "cluster.yaml" and e.value.line == BASE.splitlines().index(LINE) + 1, str(e.value)
    for w in words:
        assert w in str(e.value), str(e.value)


@pytest.mark.parametrize("text, words", [
    (BASE.replace(LINE, LINE[:-1] + ", idle: {after: 1m, exempt_teams: [vision, infra]}}"),
     ["classes[2] (batch): idle.exempt_teams: no team 'infra'", "teams are ['nlp', 'vision']"]),
    (BASE.replace(LINE, LINE[:-1] + ", idle: {after: 1m}, idle_timeout: 1h}"),
     ["class 'batch': give idle (or its old form idle_timeout), not both"]),
])
def test_idle_must_agree_with_the_rest_of_the_configuration(text, words) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(text, "cluster.yaml")
    for w in words:
        assert w in str(e.value), str(e.value)


def test_yard_up_with_a_malformed_idle_policy_exits_2_naming_it_and_writes_nothing(tmp_path: Path) -> None:
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(BASE.replace(LINE, LINE[:-1] + ", idle: {after: 1m, below: 5 percent, action: requeue}}"))
    data = tmp_path / "data"
    data.mkdir()
    p = subprocess.run([YARD, "up", "--data-dir", str(data), "--port", "0", "--login-socket", "none",
                        "--config", str(cfg)], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 2, p.stderr
    assert f"{cfg}:{BASE.splitlines().index(LINE) + 1}, field 'classes.2.idle.below'" in p.stderr, p.stderr
    assert "cannot read '5 percent' as a percent" in p.stderr
    assert list(data.iterdir()) == []  # no store, no log: nothing written


def test_the_example_s_interactive_class_uses_idle() -> None:
    from trainyard.spec.models import EXAMPLE_CONFIG, load_config

    pol = policies(load_config(EXAMPLE_CONFIG))["interactive"]
    assert (pol.after, pol.action, pol.below, pol.allocations_only) == (3600, "cancel", 5, False)
