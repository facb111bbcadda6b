"""The pilot pool through the API (api/routers/pilot.py → services/pilot.py) on a real plane:
a pilot file is validated exactly as `apply` validates it and nothing is stored when it is bad;
what a pilot cannot try is refused, naming the section; a trial, its promotion and its rollback
are each a configuration version with its audit events."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.plane import TWO_TEAMS, Plane

CHECK = {"name": "ecc", "command": ["true"], "timeout": "5s"}


@pytest.fixture
def plane(tmp_path):
    d = yaml.safe_load(TWO_TEAMS.read_text())
    d["pilot"] = {"nodes": "node-0"}
    path = tmp_path / "config.yaml"
    path.write_text("# the lab's cluster\n" + yaml.safe_dump(d, sort_keys=False))
    p = Plane(tmp_path / "yard", config=path, start=False)
    yield p
    p.cp.stop()


def stored(p: Plane) -> dict[str, Any]:
    r = p.admin.get("/api/v1/cluster/config")
    assert r.status_code == 200, r.text
    return r.json()


def versions(p: Plane) -> list[int]:
    return [v["version"] for v in p.admin.get("/api/v1/cluster/config/versions").json()["versions"]]


def edited(p: Plane, change) -> str:  # noqa: ANN001
    d = yaml.safe_load(stored(p)["text"])
    change(d)
    return yaml.safe_dump(d, sort_keys=False)


def events(p: Plane, prefix: str) -> list[dict[str, Any]]:
    evs = p.admin.get("/api/v1/events", params={"limit": 1000}).json()["events"]
    return [e for e in evs if e["kind"].startswith(prefix)]


BAD_FILES = [
    "cluster: [unclosed\n",
    "cluster: {nodes: []}\nteams: []\nclasses: []\n",
    yaml.safe_dump({**yaml.safe_load(TWO_TEAMS.read_text()), "health": {"checks": [{"name": "x", "kind": "command"}]}}),
    yaml.safe_dump({**yaml.safe_load(TWO_TEAMS.read_text()), "pilot": {"nodes": "gpu-7"}}),
]


@pytest.mark.parametrize("text", BAD_FILES)
def test_a_bad_pilot_file_gives_the_same_error_as_apply_and_stores_nothing(plane, text):
    before = versions(plane)
    as_apply = plane.admin.post("/api/v1/cluster/config", json={"text": text})
    as_pilot = plane.admin.post("/api/v1/cluster/pilot", json={"text": text})
    assert as_apply.status_code == as_pilot.status_code == 400, (as_apply.text, as_pilot.text)
    assert as_pilot.json() == as_apply.json()
    assert versions(plane) == before and events(plane, "pilot.") == []


def test_what_a_pilot_cannot_try_is_refused_naming_the_section(plane):
    before = versions(plane)
    text = edited(plane, lambda d: (d["teams"][0]["quotas"]["default"].update(nominal=2),
                                    d.update(health={"checks": [CHECK]})))
    r = plane.admin.post("/api/v1/cluster/pilot", json={"text": text})
    assert r.status_code == 400 and r.json()["field"] == "teams", r.text
    assert "teams: differs from the configuration in force" in r.json()["detail"]
    r = plane.admin.post("/api/v1/cluster/pilot", json={"text": stored(plane)["text"]})
    assert r.status_code == 400 and "changes nothing" in r.json()["detail"], r.text
    member = plane.as_user("ann", "member", "vision")
    r = member.post("/api/v1/cluster/pilot", json={"text": edited(plane, lambda d: d.update(health={"checks": [CHECK]}))})
    assert r.status_code == 403, r.text
    assert plane.admin.post("/api/v1/cluster/pilot/rollback", json={}).status_code == 409
    assert versions(plane) == before


def test_no_pilot_pool_no_trial(tmp_path):
    p = Plane(tmp_path / "yard", start=False)
    try:
        text = yaml.safe_dump({**yaml.safe_load(p.admin.get("/api/v1/cluster/config").json()["text"]),
                               "health": {"checks": [CHECK]}})
        r = p.admin.post("/api/v1/cluster/pilot", json={"text": text})
        assert r.status_code == 409 and "no pilot pool" in r.json()["detail"], r.text
        assert p.admin.get("/api/v1/cluster/pilot/status").json()["pilot"] is None
    finally:
        p.cp.stop()


def test_trial_promote_and_rollback_are_versions_with_audit_events(plane):
    base = stored(plane)
    with_check = edited(plane, lambda d: d.update(health={"checks": [CHECK]}))
    r = plane.admin.post("/api/v1/cluster/pilot", json={"text": with_check, "message": "try ecc"})
    assert r.status_code == 200, r.text
    trial_v = r.json()["version"]
    text = stored(plane)["text"]
    assert text.startswith("# the lab's cluster\n")  # the rest of the text as it was, comments included
    assert yaml.safe_load(text)["pilot"]["trial"]["health"] == {"checks": [CHECK]}
    assert "health" not in yaml.safe_load(text)  # the nodes outside the pilot run as before
    st = plane.admin.get("/api/v1/cluster/pilot/status").json()
    assert st["trial"]["changes"] == ["check ecc added (command)"] and st["trial"]["message"] == "try ecc"
    assert st["sides"]["pilot"]["nodes"] == ["node-0"] and st["sides"]["rest"]["nodes"] == ["node-1"]
    again = plane.admin.post("/api/v1/cluster/pilot", json={"text": with_check})
    assert again.status_code == 409 and "a trial is in progress" in again.json()["detail"]

    r = plane.admin.post("/api/v1/cluster/pilot/rollback", json={})
    assert r.status_code == 200, r.text
    assert r.json()["text"] == base["text"]  # the version before the trial, exactly
    assert plane.admin.get("/api/v1/cluster/pilot/status").json()["trial"] is None

    assert plane.admin.post("/api/v1/cluster/pilot", json={"text": with_check}).status_code == 200
    r = plane.admin.post("/api/v1/cluster/pilot/promote", json={"message": "ecc everywhere"})
    assert r.status_code == 200, r.text
    promoted = yaml.safe_load(r.json()["text"])
    assert promoted["health"] == {"checks": [CHECK]} and "trial" not in promoted["pilot"]
    assert r.json()["message"] == "ecc everywhere"

    kinds = [e["kind"] for e in events(plane, "pilot.")]
    assert sorted(kinds) == ["pilot.applied", "pilot.applied", "pilot.promoted", "pilot.rolled_back"]
    applied = [e for e in events(plane, "config.applied") if e["data"]["version"] >= trial_v]
    assert len(applied) == 4  # each step a version, each version its event
    assert versions(plane)[:4] == [trial_v + 3, trial_v + 2, trial_v + 1, trial_v]


def test_a_features_trial_shows_on_the_pilot_node_only_and_promotes_to_its_entry(plane):
    def ib(d: dict[str, Any]) -> None:
        d["cluster"]["nodes"][0]["features"] = ["ib"]
    assert plane.admin.post("/api/v1/cluster/pilot", json={"text": edited(plane, ib)}).status_code == 200
    with plane.cp.store.session() as s:
        feats = {n.name: set(n.features) for n in plane.cp.configs.current(s).nodes}
    assert feats == {"node-0": {"ib"}, "node-1": set()}
    plane.cp.start()
    j = plane.submit(command=["true"], gpus=1, team="vision", constraint="ib")  # -C ib: the pilot's feature
    assert plane.wait(j["id"], "COMPLETED")["attempts"][0]["placement"][0]["node"] == "node-0"
    r = plane.admin.post("/api/v1/cluster/pilot/promote", json={})
    assert yaml.safe_load(r.json()["text"])["cluster"]["nodes"][0]["features"] == ["ib"]
    with plane.cp.store.session() as s:
        assert all(n.features == {"ib"} for n in plane.cp.configs.current(s).nodes)


def test_status_compares_the_pilots_jobs_with_the_rests(plane):
    """One job fails on the pilot node, one completes on the other: failure rates 1 and 0, and each
    side's allocated GPU-seconds from the goodput ledger."""
    assert plane.admin.post("/api/v1/cluster/pilot", json={"text": edited(
        plane, lambda d: d["cluster"]["nodes"][0].update(features=["ib"]))}).status_code == 200
    plane.cp.start()
    fails = plane.submit(command=["sh", "-c", "sleep 0.5; exit 3"], gpus=1, team="vision", nodelist="node-0")
    works = plane.submit(command=["sh", "-c", "sleep 0.5"], gpus=1, team="vision", nodelist="node-1")
    assert plane.wait(fails["id"], ("FAILED",))["attempts"][0]["placement"][0]["node"] == "node-0"
    plane.wait(works["id"], "COMPLETED")
    sides = plane.admin.get("/api/v1/cluster/pilot/status").json()["sides"]
    p, r = sides["pilot"], sides["rest"]
    assert (p["attempts_ended"], p["attempts_failed"], p["failure_rate"]) == (1, 1, 1.0)
    assert (r["attempts_ended"], r["attempts_failed"], r["failure_rate"]) == (1, 0, 0.0)
    assert p["allocated_gpu_s"] > 0.4 and r["allocated_gpu_s"] > 0.4
    assert p["downs"] == r["downs"] == 0


def test_a_whole_apply_during_a_trial_says_it_ends_the_trial(plane):
    base = stored(plane)["text"]
    assert plane.admin.post("/api/v1/cluster/pilot", json={"text": edited(plane, lambda d: d.update(
        health={"checks": [CHECK]}))}).status_code == 200
    r = plane.admin.post("/api/v1/cluster/config", json={"text": base})
    assert r.status_code == 200, r.text
    assert any("ends the pilot's trial" in w for w in r.json()["warnings"]), r.json()
    r = plane.admin.post("/api/v1/cluster/config", json={"text": base + "# again\n"})
    assert not any("trial" in w for w in r.json()["warnings"]), r.json()  # no trial left to end
    assert plane.admin.post("/api/v1/cluster/pilot", json={"text": edited(plane, lambda d: d.update(
        health={"checks": [CHECK]}))}).status_code == 200
    r = plane.admin.post("/api/v1/cluster/pilot/rollback", json={})
    assert r.status_code == 200 and not any("trial" in w for w in r.json()["warnings"]), r.json()  # its own job
