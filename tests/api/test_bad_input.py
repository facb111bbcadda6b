"""Bad input answers 4xx, names the field, and writes nothing.

Service errors answer `{"detail": message, "field": name}`; request validation keeps FastAPI's 422
shape, whose `detail[0].loc` names the field. Every rejected submit is checked to leave the job
and event tables as they were.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from tests.api.helpers import job_count, store_snapshot
from tests.plane import TWO_TEAMS, Plane, job_dir, script, wait_until


@pytest.fixture(scope="module")
def p(tmp_path_factory: pytest.TempPathFactory):
    plane = Plane(tmp_path_factory.mktemp("bad_input"))
    try:
        yield plane
    finally:
        plane.stop()


def field_of(r: Any) -> str | None:
    """The field a 4xx names: `field` of a service error, the last part of a 422's `loc`."""
    body = r.json()
    if r.status_code == 422:
        loc = body["detail"][0]["loc"]
        return ".".join(str(x) for x in loc[1:]) if len(loc) > 1 else str(loc[0])
    return body["field"]


OK = {"command": script("pass"), "team": "vision"}

SUBMITS = [
    # (id, changes to a valid body, status, field)
    ("gpus-zero", {"gpus": 0}, 422, "gpus"),
    ("gpus-negative", {"gpus": -2}, 422, "gpus"),
    ("gpus-not-a-number", {"gpus": "four"}, 422, "gpus"),
    ("gpus-per-node-above-any-node", {"gpus_per_node": 5}, 400, "gpus_per_node"),
    ("gpus-per-node-above-any-node-in-a-gang", {"nodes": 2, "gpus_per_node": 5}, 400, "gpus_per_node"),
    ("nodes-above-cluster", {"nodes": 3}, 400, "nodes"),
    ("node-range-above-cluster", {"nodes": "1-3"}, 400, "nodes"),
    ("gpus-above-pool", {"gpus": 9}, 400, "gpus"),
    ("gpus-not-dividing-over-nodes", {"nodes": 2, "gpus": 3}, 400, "gpus"),
    ("gpus-disagree-with-shape", {"nodes": 2, "gpus_per_node": 2, "gpus": 6}, 400, "gpus"),
    ("tasks-not-dividing", {"gpus": 4, "tasks_per_node": 3}, 400, "tasks_per_node"),
    ("gpu-mem-above-gpu-size", {"gpu_mem_gb": 17}, 400, "gpu_mem_gb"),
    ("gpu-mem-zero", {"gpu_mem_gb": 0}, 422, "gpu_mem_gb"),
    ("mem-not-a-size", {"mem": "lots"}, 422, "mem"),
    ("mem-negative", {"mem": -5}, 422, "mem"),
    ("mem-per-gpu-bad-unit", {"mem_per_gpu": "4Q"}, 422, "mem_per_gpu"),
    ("mem-and-mem-per-gpu", {"mem": "4G", "mem_per_gpu": "1G"}, 400, "mem_per_gpu"),
    ("cpus-per-task-zero", {"cpus_per_task": 0}, 422, "cpus_per_task"),
    ("unknown-team", {"team": "robotics"}, 400, "team"),
    ("unknown-class", {"class": "urgent"}, 400, "class"),
    ("unknown-pool", {"pool": "a100"}, 400, "pool"),
    ("missing-command-and-script", {"command": None}, 400, "command"),
    ("empty-command", {"command": []}, 400, "command"),
    ("command-first-word-blank", {"command": [" ", "x"]}, 422, "command"),
    ("workdir-missing", {"workdir": "/nonexistent/trainyard-test"}, 400, "workdir"),
    ("time-above-class-max", {"class": "interactive", "time": "9h"}, 400, "time"),
    ("time-unreadable", {"time": "soon"}, 422, "time"),
    ("time-negative", {"time": -5}, 422, "time"),
    ("time-nan", {"time": float("nan")}, 400, "time"),
    ("checkpoint-interval-zero", {"checkpoint_interval": "0"}, 422, "checkpoint_interval"),
    ("node-range-reversed", {"nodes": "3-1"}, 422, "nodes"),
    ("node-range-garbage", {"nodes": "x"}, 422, "nodes"),
    ("nodes-zero", {"nodes": 0}, 422, "nodes"),
    ("unknown-field", {"gpu": 1}, 422, "gpu"),
    ("unknown-field-typo", {"comand": ["x"]}, 422, "comand"),
    ("env-bad-name", {"env": {"A=B": "1"}}, 422, "env"),
    ("env-not-strings", {"env": {"A": 1}}, 422, "env.A"),
    ("name-too-long", {"name": "n" * 201}, 422, "name"),
    ("lone-surrogate-in-env-key", {"env": {"\ud800": "1"}}, 400, "env"),
    ("lone-surrogate-in-name", {"name": "a\udc00"}, 400, "name"),
]


def _body(changes: dict[str, Any]) -> dict[str, Any]:
    body = {**OK, **changes}
    return {k: v for k, v in body.items() if v is not None}


def _post_json(p: Plane, path: str, body: Any) -> Any:
    """POST with Python's JSON encoder (it writes NaN and lone surrogates; httpx refuses to)."""
    return p.admin.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


@pytest.mark.parametrize("changes,status,field", [s[1:] for s in SUBMITS], ids=[s[0] for s in SUBMITS])
def test_bad_submit_names_the_field_and_writes_nothing(p: Plane, changes: dict[str, Any], status: int,
                                                       field: str) -> None:
    before = store_snapshot(p)
    body = _body(changes)
    body.setdefault("workdir", str(p.cp.data_dir))
    r = _post_json(p, "/api/v1/jobs", body)
    assert r.status_code == status, r.text
    assert field_of(r) == field, r.text
    assert r.json()["detail"]
    after = store_snapshot(p)
    assert after["jobs"] == before["jobs"] and after["events"] == before["events"], "a rejected submit wrote rows"


def test_the_valid_body_of_these_tests_is_accepted(p: Plane) -> None:
    """The bodies above differ from an accepted one only by the change under test."""
    n = job_count(p)
    j = p.submit(p.admin, **OK, hold=True)
    assert job_count(p) == n + 1
    p.admin.post(f"/api/v1/jobs/{j['id']}/cancel")


def test_member_gets_field_errors_too_and_no_row(p: Plane) -> None:
    alice = p.as_user("alice", "member", "vision")
    n = job_count(p)
    r = alice.post("/api/v1/jobs", json={"command": ["x"], "gpus_per_node": 5})
    assert r.status_code == 400 and r.json()["field"] == "gpus_per_node"
    r = alice.post("/api/v1/jobs", json={"command": ["x"], "team": "nlp"})
    assert r.status_code == 403
    assert job_count(p) == n


@pytest.mark.parametrize("body", [[1, 2], "text", 5, None], ids=["list", "string", "number", "null"])
def test_submit_body_of_the_wrong_shape_is_422(p: Plane, body: Any) -> None:
    n = job_count(p)
    r = _post_json(p, "/api/v1/jobs", body)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][0] == "body", r.text
    assert job_count(p) == n


def test_submit_body_that_is_not_json_is_422(p: Plane) -> None:
    n = job_count(p)
    r = p.admin.post("/api/v1/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"
    assert job_count(p) == n


# -- configuration ---------------------------------------------------------------------------------

def _versions(p: Plane) -> list[int]:
    return [v["version"] for v in p.admin.get("/api/v1/cluster/config/versions").json()["versions"]]


def test_malformed_yaml_is_400_naming_the_line_and_no_new_version(p: Plane) -> None:
    before = _versions(p)
    text = "cluster:\n  name: test\n  nodes: [\n    {name: n, gpus: 4\nteams: []\n"  # an unclosed flow mapping
    r = p.admin.post("/api/v1/cluster/config", json={"text": text})
    assert r.status_code == 400, r.text
    m = re.search(r":(\d+): not valid YAML", r.json()["detail"])
    assert m, r.json()
    assert 3 <= int(m.group(1)) <= 5
    assert _versions(p) == before


def test_wrong_type_in_config_names_field_and_line(p: Plane) -> None:
    before = _versions(p)
    lines = TWO_TEAMS.read_text().splitlines()
    i = next(n for n, ln in enumerate(lines) if "gpus: 4" in ln)
    lines[i] = lines[i].replace("gpus: 4", "gpus: four")
    r = p.admin.post("/api/v1/cluster/config", json={"text": "\n".join(lines) + "\n"})
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "cluster.nodes.0.gpus"
    assert re.match(rf"config:{i + 1}\b", r.json()["detail"]), r.json()
    assert _versions(p) == before


def test_quota_for_unknown_pool_is_400_and_no_new_version(p: Plane) -> None:
    before = _versions(p)
    doc = yaml.safe_load(TWO_TEAMS.read_text())
    doc["teams"][0]["quotas"]["a100"] = {"nominal": 2}
    r = p.admin.post("/api/v1/cluster/config", json={"text": yaml.safe_dump(doc)})
    assert r.status_code == 400, r.text
    assert "unknown pool 'a100'" in r.json()["detail"]
    assert _versions(p) == before
    r = p.admin.put("/api/v1/teams/nlp", json={"quotas": {"a100": {"nominal": 1}}})
    assert r.status_code == 400 and "unknown pool 'a100'" in r.json()["detail"], r.text
    assert _versions(p) == before


@pytest.mark.parametrize("text,field", [
    ("- just\n- a list\n", None),
    (TWO_TEAMS.read_text().split("teams:")[0] + "teams: []\n" + "classes:" + TWO_TEAMS.read_text().split("classes:")[1],
     "teams"),
    (TWO_TEAMS.read_text().replace("default_class: training", "default_class: nope"), None),
    (TWO_TEAMS.read_text() + "surprise: 1\n", "surprise"),
], ids=["not-a-mapping", "empty-teams", "unknown-default-class", "unknown-key"])
def test_other_bad_configs_are_400(p: Plane, text: str, field: str | None) -> None:
    before = _versions(p)
    r = p.admin.post("/api/v1/cluster/config", json={"text": text})
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field
    assert _versions(p) == before


def test_quota_update_validation_is_422_naming_the_field(p: Plane) -> None:
    before = _versions(p)
    r = p.admin.put("/api/v1/teams/nlp", json={"quotas": {"default": {"nominal": -1}}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "nominal", r.text
    r = p.admin.put("/api/v1/teams/nlp", json={"quota": {}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "quota", r.text
    assert _versions(p) == before


def test_unknown_versions_are_404(p: Plane) -> None:
    before = _versions(p)
    assert p.admin.get("/api/v1/cluster/config", params={"version": 999}).status_code == 404
    assert p.admin.get("/api/v1/cluster/config/diff", params={"from": 1, "to": 999}).status_code == 404
    assert p.admin.post("/api/v1/cluster/config/rollback", json={"version": 999}).status_code == 404
    assert p.admin.get("/api/v1/cluster/config", params={"version": 0}).status_code == 422
    assert _versions(p) == before


# -- tokens, nodes, teams --------------------------------------------------------------------------

@pytest.mark.parametrize("body,status,field", [
    ({"user": "eve", "role": "root"}, 400, "role"),
    ({"user": "eve", "role": "job", "team": "vision"}, 400, "role"),
    ({"user": "eve", "role": "member"}, 400, "team"),
    ({"user": "eve", "role": "member", "team": "robotics"}, 400, "team"),
    ({"user": "  ", "role": "viewer"}, 400, "user"),
    ({"user": "", "role": "viewer"}, 422, "user"),
    ({"role": "viewer"}, 422, "user"),
], ids=["unknown-role", "job-role", "member-without-team", "unknown-team", "blank-user", "empty-user", "no-user"])
def test_bad_token_requests(p: Plane, body: dict[str, Any], status: int, field: str) -> None:
    before = store_snapshot(p)
    r = p.admin.post("/api/v1/tokens", json=body)
    assert r.status_code == status, r.text
    assert field_of(r) == field
    assert store_snapshot(p)["tokens"] == before["tokens"]


def test_unknown_node_and_team_are_404(p: Plane) -> None:
    before = store_snapshot(p)
    assert p.admin.get("/api/v1/nodes/node-9").status_code == 404
    assert p.admin.post("/api/v1/nodes/node-9/drain", json={"reason": "x"}).status_code == 404
    assert p.admin.post("/api/v1/nodes/node-9/resume").status_code == 404
    assert p.admin.get("/api/v1/teams/robotics").status_code == 404
    assert p.admin.put("/api/v1/teams/robotics", json={"cohort": "x"}).status_code == 404
    after = store_snapshot(p)
    assert after["nodes"] == before["nodes"] and after["configs"] == before["configs"]
    assert after["events"] == before["events"]


# -- jobs that do not exist, or are in the wrong state ---------------------------------------------

@pytest.mark.parametrize("method,suffix", [("GET", ""), ("GET", "/events"), ("GET", "/logs"), ("POST", "/cancel"),
                                           ("POST", "/hold"), ("POST", "/release"), ("POST", "/requeue")])
def test_unknown_job_is_404(p: Plane, method: str, suffix: str) -> None:
    before = store_snapshot(p)
    r = p.admin.request(method, f"/api/v1/jobs/987654{suffix}")
    assert r.status_code == 404, r.text
    assert "987654" in r.json()["detail"]
    assert store_snapshot(p)["events"] == before["events"]


@pytest.mark.parametrize("job_id", ["0", "-1", "abc", str(2**31), str(2**63), str(2**64)])
def test_impossible_job_ids_are_422(p: Plane, job_id: str) -> None:
    r = p.admin.get(f"/api/v1/jobs/{job_id}")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "job_id"], r.text


def test_wrong_states_are_409_and_change_nothing(p: Plane) -> None:
    done = p.submit(p.admin, command=script("print('done')"), team="vision")
    p.wait(done["id"], "COMPLETED")
    before = store_snapshot(p)
    for action in ("cancel", "hold", "release"):
        r = p.admin.post(f"/api/v1/jobs/{done['id']}/{action}")
        assert r.status_code == 409, (action, r.text)
        assert r.json()["detail"]
    assert store_snapshot(p) == before

    held = p.submit(p.admin, command=script("pass"), team="nlp", hold=True)
    before = store_snapshot(p)
    r = p.admin.post(f"/api/v1/jobs/{held['id']}/requeue")  # already waiting
    assert r.status_code == 409, r.text
    assert store_snapshot(p) == before
    assert p.admin.post(f"/api/v1/jobs/{held['id']}/cancel").status_code == 200
    before = store_snapshot(p)
    assert p.admin.post(f"/api/v1/jobs/{held['id']}/cancel").status_code == 409  # cancelled twice
    assert store_snapshot(p) == before


def test_log_of_a_rank_that_does_not_exist_is_400(p: Plane) -> None:
    done = p.submit(p.admin, command=script("print('only rank 0')"), team="vision")
    p.wait(done["id"], "COMPLETED")
    r = p.admin.get(f"/api/v1/jobs/{done['id']}/logs", params={"rank": 3})
    assert r.status_code == 400 and r.json()["field"] == "rank" and "ranks 0..0" in r.text
    assert p.admin.get(f"/api/v1/jobs/{done['id']}/logs", params={"rank": -1}).status_code == 422
    r = p.admin.get(f"/api/v1/jobs/{done['id']}/logs", params={"offset": 2**62})
    assert r.status_code == 200 and r.text == ""  # past the end: nothing (it was a 500)
    r = p.admin.get(f"/api/v1/jobs/{done['id']}/logs", params={"offset": 2**62, "follow": True})
    assert r.status_code == 200 and r.text == ""


def test_log_of_a_rank_of_the_world_not_written_yet_is_empty(p: Plane) -> None:
    """On Slurm a task creates its log file a moment after the job runs: `yard logs --rank N`
    then shows nothing yet rather than calling a rank of the job's world a mistake."""
    job = p.submit(p.admin, command=script("import time; time.sleep(60)"), team="vision", gpus=2)
    p.wait(job["id"], "RUNNING")
    log = job_dir(p.cp.data_dir, job["id"]) / "logs" / "rank-1.log"
    # RUNNING is committed before the launch: the backend makes the file after, and the rank's
    # runner opens it and writes its header line later still (it recreated a file unlinked sooner)
    wait_until(lambda: log.exists() and "=== trainyard: attempt 1" in log.read_text())
    log.unlink()  # as if rank 1 had not started
    r = p.admin.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": 1})
    assert r.status_code == 200 and r.text == ""
    r = p.admin.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": 2})
    assert r.status_code == 400 and "ranks 0..1" in r.text
    assert p.admin.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200
    p.wait(job["id"], "CANCELLED")


@pytest.mark.parametrize("params,field", [({"state": "RUNNNING"}, "state"), ({"state": "PD,XX"}, "state"),
                                          ({"limit": 0}, "limit"), ({"active": "maybe"}, "active"), ({"team": "a\x00"}, "team"),
                                          ({"user": "\x00"}, "user"), ({"class": "\x00"}, "class")])
def test_bad_queue_filters(p: Plane, params: dict[str, Any], field: str) -> None:
    r = p.admin.get("/api/v1/jobs", params=params)
    assert r.status_code in (400, 422) and field_of(r) == field, r.text


@pytest.mark.parametrize("params,field", [({"since": -1}, "since"), ({"limit": 0}, "limit"),
                                          ({"since": 2**31}, "since"), ({"job": 2**64}, "job")])
def test_bad_event_filters(p: Plane, params: dict[str, Any], field: str) -> None:
    r = p.admin.get("/api/v1/events", params=params)
    assert r.status_code == 422 and field_of(r) == field, r.text


def test_poison_values_are_refused_so_the_queue_stays_readable(p: Plane) -> None:
    """A lone surrogate or a NaN once stored made every later GET /jobs or /teams answer 500."""
    member = p.as_user("mallory", "member", "nlp")
    for extra in ({"env": {"\ud800": "1"}}, {"time": float("nan")}, {"name": "\udfff"}, {"gpu_mem_gb": float("inf")}):
        body = {"command": ["x"], "hold": True, **extra}
        r = member.post("/api/v1/jobs", content=json.dumps(body), headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
    for body in ({"cohort": "\ud800"}, {"message": "\ud800"}):
        r = p.admin.put("/api/v1/teams/nlp", content=json.dumps(body), headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
    assert p.admin.get("/api/v1/jobs").status_code == 200
    assert p.admin.get("/api/v1/teams").status_code == 200


def test_config_that_drops_a_busy_node_is_409_and_no_new_version(p: Plane) -> None:
    sleeper = p.submit(p.admin, command=script("import time; time.sleep(60)"), team="vision", nodes=2,
                       gpus_per_node=1)
    try:
        p.wait(sleeper["id"], "RUNNING")
        before = _versions(p)
        smaller = TWO_TEAMS.read_text().replace("count: 2", "count: 1")
        r = p.admin.post("/api/v1/cluster/config", json={"text": smaller})
        assert r.status_code == 409 and "node-1" in r.json()["detail"], r.text
        assert _versions(p) == before
    finally:
        p.admin.post(f"/api/v1/jobs/{sleeper['id']}/cancel")
    p.wait(sleeper["id"], "CANCELLED")
