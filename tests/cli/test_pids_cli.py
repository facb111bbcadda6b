"""The pids limit as an operator and a user meet it (issue 34 point 4), with real `yard` processes
and a real `yard up`: per class, overridden per team, reported by `yard show` as PidsLimit=, said
in `yard up`'s containment line; a malformed one is exit 2 naming the field, nothing stored."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli.yard_process import yard_process
from tests.plane import TWO_TEAMS, YARD


def config_text() -> str:
    text = TWO_TEAMS.read_text().replace("min_run_time: 0, grace_period: 3}", "min_run_time: 0, grace_period: 3, "
                                                                             "pids_max: 512}")
    return text.replace("  - name: vision\n", "  - name: vision\n    pids_max: 256\n")


# One worker for this module's tests under `make test`'s --dist loadgroup: its module-scoped
# yard up starts once, not once per worker (about 4 s of CPU each).
pytestmark = pytest.mark.xdist_group("cli-pids-cli")


@pytest.fixture(scope="module")
def yard(tmp_path_factory):
    config = tmp_path_factory.mktemp("pids-config") / "cluster.yaml"
    config.write_text(config_text())
    yield from yard_process(tmp_path_factory, "pids", config_file=config)


def shown(yard, job: str, timeout: float = 30) -> str:
    """`yard show` once the job runs (its pids limit is the one it was launched with)."""
    deadline = time.monotonic() + timeout
    while True:
        out = yard("show", job).stdout
        if "RUNNING" in out or time.monotonic() > deadline:
            return out
        time.sleep(0.1)


def test_the_teams_limit_wins_over_the_classs_and_yard_show_reports_it(yard):
    vision = yard("submit", "-A", "vision", "--parsable", "--", "sleep", "60").stdout.strip()
    nlp = yard("submit", "-A", "nlp", "--parsable", "--", "sleep", "60").stdout.strip()
    assert "PidsLimit=256" in shown(yard, vision)  # teams[vision].pids_max
    assert "PidsLimit=512" in shown(yard, nlp)  # classes[training].pids_max
    assert json.loads(yard("show", nlp, "--json").stdout)["pids_max"] == 512
    yard("cancel", vision, nlp)
    up_log = (yard.server.data_dir / "up.log").read_text()
    assert "containment:" in up_log and ("pids.max per node" in up_log or "pids not limited" in up_log)
    assert "private /tmp and /dev/shm:" in up_log


@pytest.mark.parametrize("bad", ["pids_max: 8", "pids_max: '4096'", "pids_max: 1e9"])
def test_a_malformed_pids_limit_is_exit_2_naming_the_field_and_no_new_version(yard, tmp_path, bad):
    versions = len(json.loads(yard("cluster", "history", "--json").stdout))
    typo = tmp_path / "typo.yaml"
    typo.write_text(config_text().replace("pids_max: 512", bad))
    p = yard("cluster", "apply", str(typo), ok=False)
    assert p.returncode == 2 and "classes.1.pids_max" in p.stderr
    assert len(json.loads(yard("cluster", "history", "--json").stdout)) == versions


def test_yard_up_refuses_a_malformed_pids_limit_with_exit_2_and_writes_nothing(tmp_path: Path):
    config = tmp_path / "cluster.yaml"
    config.write_text(config_text().replace("    pids_max: 256\n", "    pids_max: -1\n"))
    p = subprocess.run([YARD, "up", "--data-dir", str(tmp_path / "d"), "--port", "0", "--config", str(config)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "field 'teams.0.pids_max'" in p.stderr and f"{config}:" in p.stderr
    assert not (tmp_path / "d" / "trainyard.db").exists()
