"""The audit export (services/audit.py, `yard audit`): every change made through the API comes back
with its actor, time and before/after, in order; who may read it; bad input; JSON lines from the CLI."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from tests.api.helpers import store_snapshot
from tests.plane import Plane, script
from trainyard.cli import audit as audit_cli
from trainyard.cli.client import Client
from trainyard.cli.main import app
from trainyard.store.models import JobRow


@pytest.fixture
def plane(tmp_path):
    p = Plane(tmp_path / "yard", start=False)
    yield p
    p.cp.stop()


def changes(p: Plane) -> list[dict]:
    """Every audited change made in `p`, as the API gives them."""
    alice = p.as_user("alice", "member", "vision")  # token.created (admin)
    olga = p.as_user("olga", "operator")
    r = p.admin.put("/api/v1/teams/nlp", json={"quotas": {"default": {"nominal": 2, "borrowing_limit": 6}}})
    assert r.status_code == 200, r.text
    j = p.submit(alice, command=script("pass"), gpus=1)["id"]
    assert alice.post(f"/api/v1/jobs/{j}/hold").status_code == 200
    assert alice.post(f"/api/v1/jobs/{j}/release").status_code == 200
    assert olga.post(f"/api/v1/jobs/{j}/cancel").status_code == 200
    with p.cp.store.session.begin() as s:  # as if it had run and ended
        s.get(JobRow, j).state = "COMPLETED"
    assert alice.post(f"/api/v1/jobs/{j}/requeue").status_code == 200
    assert olga.post("/api/v1/nodes/node-1/drain", json={"reason": "fan"}).status_code == 200
    assert olga.post("/api/v1/nodes/node-1/resume").status_code == 200
    tok = p.admin.get("/api/v1/tokens").json()["tokens"]
    bob = next(t for t in tok if t["user"] == "alice")
    assert p.admin.delete(f"/api/v1/tokens/{bob['id']}").status_code == 200
    r = olga.get("/api/v1/audit", params={"since": "now-1hour"})
    assert r.status_code == 200, r.text
    return r.json()["events"]


def test_every_change_with_its_actor_and_before_after(plane):
    t0 = time.time()
    evs = changes(plane)
    kinds = [e["kind"] for e in evs]
    for k in ("config.applied", "quota.changed", "token.created", "job.submitted", "job.held", "job.released",
              "job.cancelled", "job.requeued", "node.drain", "node.up", "token.revoked"):
        assert k in kinds, (k, kinds)
    assert [e["id"] for e in evs] == sorted(e["id"] for e in evs) and all(e["time"] >= t0 - 5 for e in evs)
    by = {}
    for e in evs:
        by.setdefault(e["kind"], []).append(e)
    quota = [e for e in by["quota.changed"] if e["data"]["team"] == "nlp"][-1]
    assert quota["actor"] == "admin"
    assert quota["data"]["before"]["quotas"]["default"]["nominal"] == 4
    assert quota["data"]["after"]["quotas"]["default"] == {"nominal": 2, "borrowing_limit": 6, "lending_limit": None}
    applied = by["config.applied"][-1]["data"]
    assert applied["after"]["version"] == applied["before"]["version"] + 1
    held = by["job.held"][0]
    assert held["actor"] == "alice" and held["data"]["before"]["held"] is False and held["data"]["after"]["held"]
    cancelled = by["job.cancelled"][0]
    assert cancelled["actor"] == "olga" and cancelled["data"]["before"]["state"] == "PENDING"
    assert cancelled["data"]["after"]["state"] == "CANCELLED"
    requeued = by["job.requeued"][0]["data"]
    assert (requeued["before"]["state"], requeued["after"]["state"]) == ("COMPLETED", "REQUEUED")
    drain = by["node.drain"][0]
    assert drain["node"] == "node-1" and drain["data"]["before"]["state"] == "up"
    assert drain["data"]["after"] == {"state": "drain", "reason": "fan"}
    assert by["node.up"][0]["data"]["before"] == {"state": "drain", "reason": "fan"}
    revoked = by["token.revoked"][0]
    assert revoked["data"]["user"] == "alice" and revoked["data"]["after"] == {"revoked": True}
    assert "job.started" not in kinds  # the loop's own transitions are not changes people made


def test_filters_pages_and_who_may_read(plane):
    evs = changes(plane)
    olga = plane.as_user("olga2", "operator")
    only = olga.get("/api/v1/audit", params={"since": "now-1hour", "kind": "node.drain,node.up"}).json()["events"]
    assert [e["kind"] for e in only] == ["node.drain", "node.up"]
    mine = olga.get("/api/v1/audit", params={"since": "now-1hour", "actor": "alice"}).json()["events"]
    assert {e["actor"] for e in mine} == {"alice"} and mine
    seen, after = [], 0
    while True:
        pg = olga.get("/api/v1/audit", params={"since": "now-1hour", "limit": 3, "after": after}).json()
        seen += [e["id"] for e in pg["events"]]
        if pg["next_after"] is None:
            break
        after = pg["next_after"]
    assert seen[:len(evs)] == [e["id"] for e in evs]
    for role, team in (("viewer", None), ("member", "nlp")):
        assert plane.as_user(f"x-{role}", role, team).get("/api/v1/audit").status_code == 403


@pytest.mark.parametrize("params,field", [({"since": "last tuesday"}, "since"),
                                          ({"since": "now", "until": "now-1day"}, "until"),
                                          ({"kind": "job.started"}, "kind")])
def test_bad_input_names_the_parameter(plane, params, field):
    before = store_snapshot(plane)
    r = plane.admin.get("/api/v1/audit", params=params)
    assert r.status_code == 400 and r.json()["field"] == field, r.text
    assert store_snapshot(plane) == before


def test_yard_audit_writes_json_lines(plane, monkeypatch):
    evs = changes(plane)

    def client() -> Client:
        c = Client("http://test", plane.admin_token)
        c.http = plane.admin
        return c

    monkeypatch.setattr(audit_cli, "Client", client)
    r = CliRunner().invoke(app, ["audit", "--since", "now-1hour"])
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.output.splitlines()]
    assert [x["id"] for x in lines] == [e["id"] for e in evs] + [x["id"] for x in lines[len(evs):]]
    assert {"iso", "actor", "kind", "data", "time"} <= set(lines[0])
    r = CliRunner().invoke(app, ["audit", "--since", "whenever"])
    assert r.exit_code == 2 and "--since: cannot read 'whenever'" in r.output
