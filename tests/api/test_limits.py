"""Limits an operator sets, and bounds on what a configuration may say, through the real API: each
refusal a 4xx naming the field and the limit, and nothing stored."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.api.helpers import store_snapshot
from tests.plane import TWO_TEAMS, Plane, identity_config_text

LIMITS = """
limits:
  default: {max_submit_jobs: 3, max_env_size: 4K, max_env_vars: 20, max_command_size: 2K, max_script_size: 1K}
  teams:
    vision: {max_submit_jobs: 4, grp_submit_jobs: 6, max_array_size: 10}
  users:
    alice: {max_submit_jobs: 2, max_env_size: 8K}
"""


@pytest.fixture(scope="module")
def p(tmp_path_factory):
    plane = Plane(tmp_path_factory.mktemp("limits") / "d")
    r = plane.admin.post("/api/v1/cluster/config", json={"text": identity_config_text() + LIMITS, "message": "limits"})
    assert r.status_code == 200, r.text
    yield plane
    plane.stop()


@pytest.fixture
def clean(p: Plane):
    """Every job cancelled before and after: each test counts from zero."""
    def cancel_all() -> None:
        for j in p.admin.get("/api/v1/jobs", params={"active": "true"}).json()["jobs"]:
            p.admin.post(f"/api/v1/jobs/{j['id']}/cancel")
    cancel_all()
    yield
    cancel_all()


def held(p: Plane, client: Any, **body: Any) -> Any:
    body = {"command": ["sleep", "60"], "hold": True, "workdir": str(p.cp.data_dir), **body}
    return client.post("/api/v1/jobs", json=body)


def refused(p: Plane, r: Any, status: int, field: str, *words: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["field"] == field, body
    for w in words:
        assert w in body["detail"], body


def test_max_submit_jobs_per_user_with_the_users_entry_winning_and_nothing_stored(p: Plane, clean) -> None:
    alice = p.as_user("alice", "member", "vision")
    for _ in range(2):
        assert held(p, alice).status_code == 201
    before = store_snapshot(p)
    refused(p, held(p, alice), 403, "max_submit_jobs", "user 'alice' of team 'vision' has 2 jobs pending or running",
            "max_submit_jobs allows 2 (limits.users.alice)")
    assert store_snapshot(p) == before
    vera = p.as_user("vera", "member", "vision")  # the team's entry: each of its users may have 4
    for _ in range(4):
        assert held(p, vera).status_code == 201
    refused(p, held(p, vera), 403, "max_submit_jobs", "allows 4 (limits.teams.vision)")
    nora = p.as_user("nora", "member", "nlp")  # nlp has no entry: the default, 3
    for _ in range(3):
        assert held(p, nora).status_code == 201
    refused(p, held(p, nora), 403, "max_submit_jobs", "allows 3 (limits.default)")
    # An ended job no longer counts: cancel one, and one more may be submitted.
    first = p.admin.get("/api/v1/jobs", params={"user": "nora", "active": "true"}).json()["jobs"][0]
    p.admin.post(f"/api/v1/jobs/{first['id']}/cancel")
    assert held(p, nora).status_code == 201


def test_grp_submit_jobs_caps_the_team_and_an_array_counts_every_task(p: Plane, clean) -> None:
    vera, vic = p.as_user("vera", "member", "vision"), p.as_user("vic", "member", "vision")
    before = store_snapshot(p)
    refused(p, held(p, vera, array="0-4"), 403, "max_submit_jobs", "this submission adds 5")  # 5 tasks > 4
    assert store_snapshot(p) == before  # no task of it
    assert held(p, vera, array="0-3").status_code == 201
    assert held(p, vic, array="0-1").status_code == 201
    refused(p, held(p, vic), 403, "grp_submit_jobs", "team 'vision' has 6 jobs pending or running",
            "grp_submit_jobs allows 6 (limits.teams.vision)")


def test_max_array_size_is_slurms_every_index_below_it(p: Plane, clean) -> None:
    vera = p.as_user("vera", "member", "vision")
    before = store_snapshot(p)
    refused(p, held(p, vera, array="8-10"), 400, "array", "task index 10 is not below max_array_size 10",
            "indices go from 0 to 9")
    assert store_snapshot(p) == before
    assert held(p, vera, array="7-9").status_code == 201


@pytest.mark.parametrize("who, body, field, words", [
    ("nora", {"env": {f"V{i}": "x" for i in range(21)}}, "env", ("21 variables", "max_env_vars allows", "20")),
    ("nora", {"env": {"BIG": "x" * 5000}}, "env", ("5005 bytes", "max_env_size", "4096 (limits.default)")),
    ("alice", {"env": {"BIG": "x" * 9000}}, "env", ("max_env_size", "8192 (limits.users.alice)")),
    ("nora", {"command": ["echo", "y" * 3000]}, "command", ("3006 bytes", "max_command_size", "2048")),
    ("nora", {"command": [], "script": "#!/bin/bash\n" + "#" * 2000}, "script",
     ("the batch script is 2012 bytes", "max_script_size")),
])
def test_sizes_of_command_environment_and_script(p: Plane, clean, who: str, body: dict, field: str, words: tuple) -> None:
    client = p.as_user(who, "member", "vision" if who == "alice" else "nlp")
    before = store_snapshot(p)
    refused(p, held(p, client, **body), 400, field, *words)
    assert store_snapshot(p) == before


def test_the_size_limits_hold_for_an_admin_too_and_a_big_array_stores_its_script_once(p: Plane, clean) -> None:
    refused(p, held(p, p.admin, team="nlp", env={"BIG": "x" * 5000}), 400, "env", "user 'admin' of team 'nlp'")
    r = held(p, p.admin, team="vision", command=[], script="#!/bin/bash\necho task $SLURM_ARRAY_TASK_ID\n",
             array="0-2")
    assert r.status_code == 201, r.text
    aid = r.json()["id"]
    with p.cp.store.session() as s:
        from trainyard.store.models import JobRow
        scripts = [j.script for j in s.query(JobRow).filter(JobRow.array_job_id == aid).order_by(JobRow.id)]
    assert scripts[0] is not None and scripts[1:] == [None, None]
    tasks = p.admin.get("/api/v1/jobs", params={"array": aid}).json()["jobs"]
    for t in tasks:
        p.admin.post(f"/api/v1/jobs/{t['id']}/release")
    last = next(t for t in tasks if t["array_task_id"] == 2)
    p.wait(last["id"], "COMPLETED")  # a later task runs the script kept with the first
    assert "task 2" in p.admin.get(f"/api/v1/jobs/{last['id']}/logs").text


# -- bounds on the configuration ---------------------------------------------------------------------

def nested(depth: int) -> str:
    return "cluster:\n  nodes: " + "[" * depth + "]" * depth + "\n"


@pytest.mark.parametrize("text, field, words", [
    (TWO_TEAMS.read_text().replace("count: 2", "count: 100000000"), "cluster.nodes.0.count",
     ("less than or equal to 10000",)),
    (TWO_TEAMS.read_text().replace("- {name: node, count: 2,", "- {name: more, count: 9000, gpus: 1}\n    - "
                                   "{name: node, count: 9000,"),
     "cluster", ("18000 nodes in all; a configuration holds at most 10000",)),
    (TWO_TEAMS.read_text().replace("gpu_mem_gb: 16", "gpu_mem_gb: .inf"), "cluster.nodes.0.gpu_mem_gb", ()),
    (TWO_TEAMS.read_text().replace("priority: 300", "priority: 100000000000"), "classes.0.priority",
     ("less than or equal to 1000000000",)),
    (TWO_TEAMS.read_text() + "limits:\n  default: {max_submit_jobs: 100000000}\n", "limits.default.max_submit_jobs",
     ("less than or equal to 1000000",)),
    (TWO_TEAMS.read_text() + "limits:\n  teams:\n    nobody: {max_submit_jobs: 1}\n", None, ("no team 'nobody'",)),
    (nested(10_000), None, ("nested more than 32 levels deep",)),
    ("a: &a [1,2,3,4,5,6,7,8,9,10]\n" + "".join(f"{x}: &{x} [{', '.join(['*' + p] * 10)}]\n"
                                                for p, x in zip("abcdef", "bcdefg")),
     None, ("more than 200000 values",)),
    ("x: &x [*x]\n", None, ("refers to a node that contains it",)),
])
def test_a_config_out_of_bounds_is_400_naming_the_problem_and_no_new_version(p: Plane, text: str, field: str | None,
                                                                             words: tuple) -> None:
    before = store_snapshot(p)
    t0 = time.monotonic()
    r = p.admin.post("/api/v1/cluster/config", json={"text": text})
    assert r.status_code == 400, r.text
    assert time.monotonic() - t0 < 10  # refused at once, the plane not taken down
    if field is not None:
        assert r.json()["field"] == field, r.json()
    for w in words:
        assert w in r.json()["detail"], r.json()
    assert store_snapshot(p) == before
    assert p.admin.get("/healthz").status_code == 200


def test_a_deeply_nested_json_body_is_a_4xx_not_a_500(p: Plane) -> None:
    for path in ("/api/v1/jobs", "/api/v1/cluster/config"):
        r = p.admin.post(path, content="[" * 100_000 + "]" * 100_000, headers={"Content-Type": "application/json"})
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text[:200])
    r = p.admin.post("/api/v1/jobs", content=json.dumps({"env": {"A": "b"}, "command": ["true"]}),
                     headers={"Content-Type": "application/json"})
    assert r.status_code in (201, 400, 403), r.text
