"""Operator limits and configuration bounds as a person meets them in the CLI: exit 2 and one
line naming the field and the limit, nothing stored. Real `yard` processes, a real `yard up`."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli.yard_process import yard_process
from tests.plane import TWO_TEAMS, YARD

LIMITS = """
limits:
  default: {max_submit_jobs: 2, max_env_size: 1K}
  teams:
    vision: {max_array_size: 10}
"""


# One worker for this module's tests under `make test`'s --dist loadgroup: its module-scoped
# yard up starts once, not once per worker (about 4 s of CPU each).
pytestmark = pytest.mark.xdist_group("cli-limits-cli")


@pytest.fixture(scope="module")
def yard(tmp_path_factory):
    config = tmp_path_factory.mktemp("limits-config") / "cluster.yaml"
    config.write_text(TWO_TEAMS.read_text() + LIMITS)
    yield from yard_process(tmp_path_factory, "limits", config_file=config)


def jobs(yard) -> int:
    return len(json.loads(yard("queue", "--all", "--json").stdout))


def test_max_submit_jobs_and_sizes_refuse_with_exit_2_naming_the_field(yard):
    for _ in range(2):  # --export=NONE: the test's shell alone is over max_env_size 1K
        yard("submit", "-H", "-A", "nlp", "--export=NONE", "--", "sleep", "60")
    before = jobs(yard)
    third = yard("submit", "-H", "-A", "nlp", "--export=NONE", "--", "sleep", "60", ok=False)
    assert third.returncode == 2 and "field 'max_submit_jobs'" in third.stderr
    assert "has 2 jobs pending or running and max_submit_jobs allows 2 (limits.default)" in third.stderr
    big = yard("submit", "-H", "-A", "vision", "--export=NONE", "--env", "X=" + "y" * 2000, "--", "true", ok=False)
    assert big.returncode == 2 and "field 'env'" in big.stderr and "max_env_size" in big.stderr
    # the shell's environment (--export=ALL, the default) is sent whole; over the limit, the limit says so
    shell = yard("submit", "-H", "-A", "vision", "--", "true", ok=False)
    assert shell.returncode == 2 and "field 'env'" in shell.stderr and "max_env_size" in shell.stderr
    wide = yard("submit", "-H", "-A", "vision", "--export=NONE", "--array", "5-12", "--", "true", ok=False)
    assert wide.returncode == 2 and "field 'array'" in wide.stderr and "max_array_size 10" in wide.stderr
    assert jobs(yard) == before


def test_a_config_typo_or_deep_nesting_is_exit_2_and_no_new_version(yard, tmp_path):
    versions = len(json.loads(yard("cluster", "history", "--json").stdout))
    typo = tmp_path / "typo.yaml"
    typo.write_text(TWO_TEAMS.read_text().replace("count: 2", "count: 100000000"))
    bad = yard("cluster", "apply", str(typo), ok=False)
    assert bad.returncode == 2 and "cluster.nodes.0.count" in bad.stderr and "10000" in bad.stderr
    deep = tmp_path / "deep.yaml"
    deep.write_text("cluster: " + "[" * 5000 + "]" * 5000 + "\n")
    bad = yard("cluster", "apply", str(deep), ok=False)
    assert bad.returncode == 2 and "nested more than 32 levels deep" in bad.stderr
    assert len(json.loads(yard("cluster", "history", "--json").stdout)) == versions


@pytest.mark.parametrize("change, says", [
    (lambda t: t.replace("count: 2", "count: 100000000"), "field 'cluster.nodes.0.count'"),
    (lambda t: "cluster:\n  nodes: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than 32 levels deep"),
])
def test_yard_up_refuses_such_a_config_at_once(tmp_path: Path, change, says):
    config = tmp_path / "cluster.yaml"
    config.write_text(change(TWO_TEAMS.read_text()))
    t0 = time.monotonic()
    p = subprocess.run([YARD, "up", "--data-dir", str(tmp_path / "d"), "--port", "0", "--login-socket", "none", "--config", str(config)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and says in p.stderr and f"{config}:" in p.stderr
    assert time.monotonic() - t0 < 30  # (the typo once took 2.5 minutes and 8 GB before anything answered)
