"""`yard report`'s outputs (aligned sections, CSV, '|', JSON) over the accounting tests' written
history, the CLI talking to an in-process API (its HTTP client swapped for the app's TestClient);
bad arguments fail naming the option, exit 2, before any request."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Iterator

import pytest
from typer.testing import CliRunner

from tests.plane import Plane
from tests.services.acct_history import NOW, T0, H, History
from trainyard.cli import report as report_cli
from trainyard.cli.client import Client
from trainyard.cli.main import app

PERIOD = ("-S", f"@{T0 + H}", "-E", f"@{T0 + 3 * H}")


@pytest.fixture(scope="module")
def plane(tmp_path_factory) -> Iterator[Plane]:
    p = Plane(tmp_path_factory.mktemp("report") / "yard", start=False)
    p.cp.clock = lambda: NOW
    History(p)
    yield p
    p.cp.stop()


@pytest.fixture
def yard(plane, monkeypatch):
    def client() -> Client:
        c = Client("http://test", plane.admin_token)
        c.http = plane.admin
        return c

    monkeypatch.setattr(report_cli, "Client", client)

    def run(*args: str):  # noqa: ANN202
        return CliRunner().invoke(app, ["report", *args])
    return run


def test_summary_prints_every_section(yard):
    r = yard(*PERIOD)
    assert r.exit_code == 0, r.output
    for name in ("cluster", "pools", "teams", "users", "waits", "lost", "outcomes"):
        assert f"\n{name}" in r.output
    assert "Usage of test from" in r.output and "users shown: all" in r.output


def test_teams_as_csv_and_parsable2(yard, plane):
    r = yard("teams", "--csv", *PERIOD)
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader(io.StringIO(r.output)))
    api = plane.admin.get("/api/v1/report", params={"start": f"@{T0 + H}", "end": f"@{T0 + 3 * H}"}).json()
    assert [(x["Team"], x["Pool"]) for x in rows] == [(t["team"], t["pool"]) for t in api["teams"]]
    nlp = next(x for x in rows if x["Team"] == "nlp")
    assert nlp["GPUh"] == "1.75" and nlp["OOM%"] == "100.0" and nlp["Nominal"] == "4"
    r = yard("lost", "-P", "-n", *PERIOD)
    assert sorted(r.output.splitlines()) == sorted(["(cluster)||oom|0.20", "(cluster)||preempted|0.20",
                                                    "nlp|default|oom|0.20", "vision|default|preempted|0.20"])


def test_json_is_the_apis_report(yard, plane):
    r = yard("--json", *PERIOD)
    api = plane.admin.get("/api/v1/report", params={"start": f"@{T0 + H}", "end": f"@{T0 + 3 * H}"}).json()
    assert json.loads(r.output) == api


@pytest.mark.parametrize("args,needle", [
    (("-S", "soonish"), "--start: cannot read 'soonish'"),
    (("-E", "2026-02-30"), "--end:"),
    (("-S", "now", "-E", "now-1day"), "--end ("),
    (("everything",), "SECTION: 'everything' is not one of"),
])
def test_bad_arguments_name_the_option_and_exit_2(args, needle, monkeypatch, tmp_path: Path):
    monkeypatch.setenv("YARD_URL", "http://127.0.0.1:9")  # nothing listens: a request would be exit 1
    monkeypatch.setenv("YARD_TOKEN", "t")
    r = CliRunner().invoke(app, ["report", *args])
    assert r.exit_code == 2 and needle in r.output, r.output


def test_the_clis_goodput_sections_and_buckets_are_the_services():
    """The CLI checks `--by` before asking (without loading the services): the same names."""
    from trainyard.cli import acct as acct_cli
    from trainyard.contracts import LEDGER_BUCKETS
    from trainyard.services import goodput_report

    assert report_cli.GOODPUT_BY == goodput_report.SECTIONS
    assert report_cli.LEDGER == LEDGER_BUCKETS == tuple(b for _, _, b, _ in acct_cli.LEDGER_FIELDS)
