"""The configuration page in a real headless Chromium (Playwright, the system's browser; the
fixtures of tests/api/test_dashboard_browser.py) against a real `yard up` holding a recorded day of
three teams (`tests/sim/recorded_day.py`, written while the plane is down, as
tests/cli/test_whatif_yard_up.py does): an admin opens the page, edits the proposal in the form to
halve team-a's quota, submits it and reads the side-by-side table, which says what the API says.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from tests.api.test_dashboard_browser import chromium, login, shot  # noqa: F401 (chromium: a fixture)
from tests.sim.recorded_day import half_quota, yard_up_with_a_recorded_day
from tests.yard_cluster import YardCluster

pytestmark = pytest.mark.xdist_group("dashboard-config-browser")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[YardCluster]:
    with yard_up_with_a_recorded_day(tmp_path_factory.mktemp("dashconfig-up")) as c:
        yield c


def test_an_admin_halves_a_teams_quota_in_the_what_if_form_and_reads_the_table(cluster: YardCluster,
                                                                                chromium: Any) -> None:  # noqa: F811
    page = login(chromium, cluster.server.url, cluster.server.token)
    page.click("nav >> text=configuration")
    page.wait_for_url("**/ui/config")
    in_force = cluster.http.get("/api/v1/cluster/config").json()
    assert page.locator("#in-force").get_attribute("data-version") == str(in_force["version"])
    assert page.input_value("#proposal") == in_force["text"]  # pre-filled with the configuration in force
    assert page.input_value("#since") == "now-14days"
    proposal = half_quota(in_force["text"])
    page.fill("#proposal", proposal)
    page.fill("#since", "now-3days")
    page.click("#what-if-form button[type=submit]")
    page.wait_for_selector("#what-if-table", timeout=20_000)
    shot(page, "config-what-if")
    api = cluster.http.post("/api/v1/cluster/config/what-if", json={"text": proposal, "since": "now-3days"},
                            timeout=60).json()
    assert page.locator("#what-if-jobs").inner_text() == str(api["jobs"]) == "100"

    def row(group: str, figure: str) -> list[str]:
        return page.locator(f'#what-if-table tr[data-group="{group}"][data-figure="{figure}"] td').all_inner_texts()

    assert row("team team-a", "quota_share") == ["team team-a", "quota_share", "0.500", "0.250", "−0.250"]
    a = page.locator('#what-if-table tr[data-group="team team-a"][data-figure="p99_wait_s"]')
    assert float(a.get_attribute("data-delta")) == api["delta"]["teams"]["team-a"]["p99_wait_s"] > 0
    assert row("team team-a", "p99_wait_s")[4].startswith("+")
    for team in ("team-b", "team-c"):
        assert row(f"team {team}", "p99_wait_s")[4].startswith("−")
    assert page.input_value("#proposal") == proposal  # the form keeps what was proposed
    versions = cluster.http.get("/api/v1/cluster/config/versions").json()["versions"]
    assert versions[0]["version"] == in_force["version"]  # nothing applied
