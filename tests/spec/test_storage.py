"""`storage:` in the configuration (spec.StorageSpec, TeamStorageSpec): a team's quota or the
cluster's, the reserve, and every malformed value refused naming its field; through the API a 400
and no new version, through `yard up --config` exit 2 and nothing written."""

from __future__ import annotations

import subprocess

import pytest

from tests.plane import TWO_TEAMS, YARD, Plane
from trainyard.spec.models import ConfigError, parse_config

GiB = 1 << 30


def vision(storage: str) -> str:
    return TWO_TEAMS.read_text().replace("  - name: vision\n", f"  - name: vision\n    storage: {storage}\n", 1)


def test_a_teams_quota_wins_over_the_clusters_and_none_means_none():
    spec = parse_config(vision("{quota_gb: 1.5}") + "storage: {quota_gb: 100, reserve_gb: 20, interval: 30s}\n")
    teams = {t.name: t for t in spec.teams}
    assert spec.storage.quota_bytes(teams["vision"]) == int(1.5 * GiB)
    assert spec.storage.quota_bytes(teams["nlp"]) == 100 * GiB
    assert spec.storage.interval == 30.0
    assert spec.storage.reserve_bytes(100 * GiB) == 20 * GiB  # 5% of 100 GiB is less than 20 GiB
    assert spec.storage.reserve_bytes(1000 * GiB) == 50 * GiB  # 5% of 1000 GiB is more
    bare = parse_config(TWO_TEAMS.read_text())
    assert all(bare.storage.quota_bytes(t) is None for t in bare.teams)  # no quota unless one is set
    assert bare.storage.reserve_percent == 5.0 and bare.storage.interval == 300.0


@pytest.mark.parametrize("text, field", [
    (vision("{quota_gb: -1}"), "teams.0.storage.quota_gb"),
    (vision("{quota_gb: 0}"), "teams.0.storage.quota_gb"),
    (vision("{quota_gb: .nan}"), "teams.0.storage.quota_gb"),
    (vision("{quota_gb: 1e12}"), "teams.0.storage.quota_gb"),
    (vision("{quota_gb: lots}"), "teams.0.storage.quota_gb"),
    (vision("{quota: 3}"), "teams.0.storage.quota"),
    (vision("5"), "teams.0.storage"),
    (TWO_TEAMS.read_text() + "storage: 5\n", "storage"),
    (TWO_TEAMS.read_text() + "storage: {quota_gb: .inf}\n", "storage.quota_gb"),
    (TWO_TEAMS.read_text() + "storage: {reserve_gb: -1}\n", "storage.reserve_gb"),
    (TWO_TEAMS.read_text() + "storage: {reserve_percent: 80}\n", "storage.reserve_percent"),
    (TWO_TEAMS.read_text() + "storage: {interval: 0.01}\n", "storage.interval"),
    (TWO_TEAMS.read_text() + "storage: {interval: forever}\n", "storage.interval"),
])
def test_a_malformed_storage_section_is_refused_naming_the_field(text, field):
    with pytest.raises(ConfigError) as e:
        parse_config(text)
    assert e.value.field == field, str(e.value)


def test_the_api_answers_400_naming_the_field_and_stores_no_version(tmp_path):
    p = Plane(tmp_path / "yard", start=False)
    try:
        before = p.admin.get("/api/v1/cluster/config/versions").json()["versions"]
        assert before
        r = p.admin.post("/api/v1/cluster/config", json={"text": vision("{quota_gb: -1}")})
        assert r.status_code == 400 and r.json()["field"] == "teams.0.storage.quota_gb", r.text
        assert p.admin.get("/api/v1/cluster/config/versions").json()["versions"] == before
    finally:
        p.cp.stop()


def test_yard_up_refuses_it_with_exit_2_and_writes_nothing(tmp_path):
    config = tmp_path / "cluster.yaml"
    config.write_text(vision("{quota_gb: -1}"))
    data = tmp_path / "d"
    p = subprocess.run([YARD, "up", "--data-dir", str(data), "--port", "0", "--login-socket", "none", "--config", str(config)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "teams.0.storage.quota_gb" in p.stderr and f"{config}:" in p.stderr, p.stderr
    assert not data.exists()
