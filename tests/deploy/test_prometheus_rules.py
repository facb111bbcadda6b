"""deploy/prometheus (issue 40): the rules pass Prometheus's own `promtool check rules` and the
unit tests beside them (`promtool test rules`), every alert carries what the on-call needs
(`for:`, a severity, a summary, a runbook_url whose anchor is a section of docs/runbooks.md), every
alert has a unit test where it fires and one where it stays quiet, every `yard` command the
runbooks tell the on-call to type exists with the options they give it, and the example
prometheus.yml and alertmanager.yml pass `promtool check config` and `amtool check-config`.

promtool is Debian's `prometheus` package: scripts/promtool-setup.sh installs it when the test
runs as root (as tests/api/test_metrics.py does); elsewhere, without it, the promtool tests skip
saying so. The rest reads the files and the CLI's own command tree: no plane, all in seconds."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

from tests.setup_once import install_once

ROOT = Path(__file__).parents[2]
PROM = ROOT / "deploy" / "prometheus"
RULES = sorted((PROM / "rules").glob("*.yml"))
UNIT_TESTS = sorted((PROM / "tests").glob("*.yml"))
ALERTS = PROM / "rules" / "trainyard-alerts.yml"
RUNBOOKS = ROOT / "docs" / "runbooks.md"


@pytest.fixture(scope="module")
def promtool() -> str:
    script = ROOT / "scripts" / "promtool-setup.sh"
    failed = install_once(script, lambda: shutil.which("promtool") is None, "TRAINYARD_PROMTOOL_NO_INSTALL")
    found = shutil.which("promtool")
    if found is None:
        pytest.skip(f"promtool is not installed and scripts/{script.name} could not install it: {failed}")
    return found


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"] if "alert" in r]


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation other than - and _ dropped, spaces to -."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", markdown, flags=re.M)}


def test_rules_pass_promtool_check(promtool: str) -> None:
    assert [p.name for p in RULES] == ["trainyard-alerts.yml", "trainyard-recording.yml"]
    r = subprocess.run([promtool, "check", "rules", *map(str, RULES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (r.stdout + r.stderr).count("SUCCESS") == len(RULES), r.stdout + r.stderr


def test_unit_tests_pass(promtool: str) -> None:
    assert UNIT_TESTS
    r = subprocess.run([promtool, "test", "rules", *map(str, UNIT_TESTS)], capture_output=True, text=True,
                       timeout=60, cwd=PROM / "tests")
    assert r.returncode == 0, r.stdout + r.stderr


def test_unit_tests_catch_a_changed_rule(promtool: str, tmp_path: Path) -> None:
    """The unit tests can fail: with the drain alert's `for:` doubled, its firing test does."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    for p in RULES:
        text = p.read_text()
        if p == ALERTS:
            assert text.count("for: 4h") == 1
            text = text.replace("for: 4h", "for: 8h")
        (tmp_path / "rules" / p.name).write_text(text)
    shutil.copy(PROM / "tests" / "nodes.yml", tmp_path / "tests" / "nodes.yml")
    r = subprocess.run([promtool, "test", "rules", "nodes.yml"], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path / "tests")
    assert r.returncode != 0 and "TrainyardNodeDraining" in r.stdout + r.stderr, r.stdout + r.stderr


def test_every_alert_has_for_severity_summary_and_a_runbook_section() -> None:
    rules = alert_rules()
    assert len(rules) >= 10
    known = anchors(RUNBOOKS.read_text())
    for rule in rules:
        name = rule["alert"]
        assert rule.get("for"), name
        assert rule.get("labels", {}).get("severity") in ("warning", "critical"), name
        ann = rule.get("annotations", {})
        assert ann.get("summary") and ann.get("description"), name
        url = ann.get("runbook_url", "")
        path, _, anchor = url.partition("#")
        assert path.endswith("docs/runbooks.md") and anchor == name.lower(), (name, url)
        assert anchor in known, f"{name}: no section #{anchor} in docs/runbooks.md"


def test_anchor_check_tells_a_missing_section() -> None:
    assert anchors("# Runbooks\n### TrainyardNodeDraining\n## A full disk\n") == {
        "runbooks", "trainyardnodedraining", "a-full-disk"}


def test_every_alert_is_unit_tested_firing_and_quiet() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for p in UNIT_TESTS:
        for t in yaml.safe_load(p.read_text())["tests"]:
            for case in t.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {r["alert"] for r in alert_rules()}
    assert names - firing == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested quiet"


def yard_commands(markdown: str) -> list[list[str]]:
    """The `yard …` spans of the runbooks, as words, up to a pipe."""
    out = []
    for span in re.findall(r"`(yard [^`]+)`", markdown):
        words = shlex.split(span.replace("…", ""))
        out.append(words[1:words.index("|")] if "|" in words else words[1:])
    return out


def command_problem(root: Any, words: list[str]) -> str | None:
    """What is wrong with `yard WORDS` by the CLI's own command tree: an unknown command or
    option, or more arguments than it takes (None: nothing)."""
    cmd, rest = root, list(words)
    while isinstance(getattr(cmd, "commands", None), dict) and rest and not rest[0].startswith("-"):
        cmd = cmd.commands.get(rest.pop(0))
        if cmd is None:
            return "no such command"
    options = {o: p for p in cmd.params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)}
    arguments = [p for p in cmd.params if p.param_type_name == "argument"]
    positional = 0
    while rest:
        w = rest.pop(0)
        if w == "--help":
            continue
        if w.startswith("-"):
            opt = options.get(w.split("=")[0])
            if opt is None:
                return f"no option {w}"
            if not opt.is_flag and "=" not in w and rest:  # its value (an option named alone: none)
                rest.pop(0)
        else:
            positional += 1
    if not any(a.nargs == -1 for a in arguments) and positional > sum(a.nargs for a in arguments):
        return "too many arguments"
    return None


@pytest.fixture(scope="module")
def cli() -> Any:
    from trainyard.cli.main import app

    return typer.main.get_command(app)


def test_runbook_yard_commands_exist_with_their_options(cli: Any) -> None:
    commands = yard_commands(RUNBOOKS.read_text())
    assert len(commands) > 30
    problems = {" ".join(w): command_problem(cli, w) for w in commands}
    assert {c: p for c, p in problems.items() if p} == {}


def test_command_check_tells_what_is_wrong(cli: Any) -> None:
    assert command_problem(cli, ["nodes", "resume", "node-1"]) == "too many arguments"
    assert command_problem(cli, ["cluster", "undo", "3"]) == "no such command"
    assert command_problem(cli, ["queue", "--partition", "x"]) == "no option --partition"
    assert command_problem(cli, ["cluster", "diff", "3", "4"]) is None
    assert command_problem(cli, ["report", "goodput", "--by", "node", "-S", "now-1day"]) is None


def test_rules_read_only_metrics_the_plane_exports() -> None:
    """Every trainyard_* series a rule reads is a family of services/metrics.py (a counter's with
    `_total`, a histogram's or summary's with `_bucket`/`_count`/`_sum`): a renamed metric breaks this."""
    source = (ROOT / "src" / "trainyard" / "services" / "metrics.py").read_text()
    families = set(re.findall(r'"(trainyard_[a-z_]+)"', source))
    read: set[str] = set()
    for p in RULES:
        for g in yaml.safe_load(p.read_text())["groups"]:
            for rule in g["rules"]:
                read |= set(re.findall(r"(?<![\w:])(trainyard_[a-z_]+)", rule["expr"]))
    assert len(read) >= 12
    unknown = {m for m in read if m not in families and re.sub(r"_(total|bucket|count|sum)$", "", m) not in families}
    assert unknown == set()


def test_the_example_configurations_pass_their_own_checks(tmp_path: Path) -> None:
    """deploy/prometheus's prometheus.yml (as the live test fills it in: its rule files found) and
    alertmanager.yml pass `promtool check config` and `amtool check-config`: what the README tells
    a site to run, here without starting either server (tests/deploy/test_alerts_live.py does)."""
    from tests.deploy.alert_stack import alertmanager_config, prometheus_config, tools_or_skip

    tools_or_skip()
    token = tmp_path / "trainyard.token"
    token.write_text("x\n")
    cfg = prometheus_config(plane="127.0.0.1:8080", token_file=token, rules=RULES, alertmanager="127.0.0.1:9093",
                            interval_s=30)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    r = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS" in r.stdout + r.stderr, r.stdout + r.stderr
    r = subprocess.run(["amtool", "check-config", str(PROM / "alertmanager.yml")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "SUCCESS" in r.stdout + r.stderr, r.stdout + r.stderr
    assert alertmanager_config(webhook="http://127.0.0.1:1", group_wait_s=1, group_interval_s=1)["receivers"][0][
        "webhook_configs"][0]["url"] == "http://127.0.0.1:1/page"
