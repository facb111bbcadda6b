"""Who may do what, across two teams: every role against every action (services/auth.py's docstring).

The plane runs without its loop thread, so that the states a test sets up stay put (a pending job
stays pending) and a refused request can be shown to have changed nothing in the store. One job
(`home`, team vision) is started by one explicit loop pass: it runs for real and hands its
`TRAINYARD_TOKEN` out through a file, and that token is the `job` role of the matrix.

Each team-scoped action is tried against a vision job and an nlp job; "own" and "other" are
relative to the caller's team (members) — admin, operator and viewer have none.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable

import pytest
from sqlalchemy import select

from tests.api.helpers import job_count, store_snapshot
from tests.plane import Plane, identity_config_text, job_dir, script
from trainyard.store.models import ConfigVersionRow, JobRow, NodeRow

ROLES = ("admin", "operator", "member:vision", "member:nlp", "viewer", "job")
TEAMS = ("vision", "nlp")
QUICK = script("pass")


class World:
    """A plane, one client per role, and the running job whose token is the `job` role."""

    def __init__(self, p: Plane, clients: dict[str, Any], home: int, home_token: str):
        self.p, self.clients, self.home, self.home_token = p, clients, home, home_token

    def job(self, team: str, *, hold: bool = False) -> int:
        return self.p.submit(self.p.admin, command=QUICK, team=team, hold=hold)["id"]

    def row(self, job_id: int) -> JobRow:
        with self.p.cp.store.session() as s:
            return s.get(JobRow, job_id)

    def set_state(self, job_id: int, state: str) -> None:
        with self.p.cp.store.session.begin() as s:
            row = s.get(JobRow, job_id)
            row.state, row.end_time, row.exit_code = state, time.time(), 0

    def node_state(self, name: str) -> str:
        with self.p.cp.store.session() as s:
            row = s.get(NodeRow, name)
            return row.state if row else "up"

    def config_versions(self) -> list[ConfigVersionRow]:
        with self.p.cp.store.session() as s:
            return list(s.scalars(select(ConfigVersionRow).order_by(ConfigVersionRow.version)))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    p = Plane(tmp_path_factory.mktemp("roles"), start=False)
    try:
        clients = {
            "admin": p.admin,
            "operator": p.as_user("olga", "operator"),
            "member:vision": p.as_user("alice", "member", "vision"),
            "member:nlp": p.as_user("bob", "member", "nlp"),
            "viewer": p.as_user("victor", "viewer"),
        }
        out = p.cp.data_dir / "home.token"
        home = p.submit(p.admin, team="vision", command=script(
            "import os, pathlib, time\n"
            f"pathlib.Path({str(out)!r}).write_text(os.environ['TRAINYARD_TOKEN'])\n"
            "print('home job log line', flush=True)\n"
            "time.sleep(120)\n"))["id"]
        p.cp.loop.step()  # one pass: the home job starts for real, on node-0
        deadline = time.monotonic() + 120
        while not out.exists() or not out.read_text():
            assert time.monotonic() < deadline, "the home job never wrote its TRAINYARD_TOKEN"
            time.sleep(0.05)
        token = out.read_text().strip()
        clients["job"] = p.client(token)
        yield World(p, clients, home, token)
    finally:
        # Cancel what waits while no loop runs (nothing of it starts), then let the loop stop the home job.
        for j in p.admin.get("/api/v1/jobs", params={"state": "PENDING,REQUEUED"}).json()["jobs"]:
            p.admin.post(f"/api/v1/jobs/{j['id']}/cancel")
        p.cp.start()
        p.stop()


def team_of(role: str) -> str | None:
    return {"member:vision": "vision", "member:nlp": "nlp", "job": "vision"}.get(role)


# -- the matrix -----------------------------------------------------------------------------------

TEAM_ACTIONS = ("submit", "get", "job_events", "cancel", "hold", "release", "requeue", "logs")
GLOBAL_ACTIONS = ("list", "events", "nodes", "node", "teams", "team", "config_get", "config_versions", "config_diff",
                  "metrics", "whoami", "drain", "resume", "update_quota", "config_apply", "config_rollback", "create_token")
READS = {"list", "events", "nodes", "node", "teams", "team", "config_get", "config_versions", "config_diff", "metrics",
         "whoami"}


def allowed_team_action(role: str, action: str, relation: str) -> bool:
    if role == "admin":
        return True
    if role == "operator":
        return action != "submit"
    if role.startswith("member:"):
        return relation == "own" or action in ("get", "job_events")
    if role == "viewer":
        return action in ("get", "job_events")
    assert role == "job"
    return False  # the targets are never the job's own job; that one is tested below


def allowed_global_action(role: str, action: str) -> bool:
    if role == "admin":
        return True
    if role == "job":
        return action == "whoami"
    if action in READS:
        return True
    if role == "operator":
        return action in ("drain", "resume")
    return False


def _team_action(w: World, client: Any, action: str, team: str) -> tuple[Any, Callable[[Any], None]]:
    """Set the target up, do the request; returns the response and the check of an allowed effect."""
    p = w.p
    if action == "submit":
        before = job_count(p)
        r = client.post("/api/v1/jobs", json={"command": QUICK, "team": team, "hold": True,
                                              "workdir": str(p.cp.data_dir)})

        def ok(r: Any) -> None:
            assert r.status_code == 201
            assert job_count(p) == before + 1
            assert w.row(r.json()["id"]).team == team
        return r, ok
    if action == "get":
        jid = w.job(team, hold=True)
        r = client.get(f"/api/v1/jobs/{jid}")

        def ok(r: Any) -> None:
            assert r.json()["id"] == jid and r.json()["team"] == team
        return r, ok
    if action == "job_events":
        jid = w.job(team, hold=True)
        r = client.get(f"/api/v1/jobs/{jid}/events")

        def ok(r: Any) -> None:
            assert [e["kind"] for e in r.json()["events"]] == ["job.submitted"]
        return r, ok
    if action == "cancel":
        jid = w.job(team, hold=True)
        r = client.post(f"/api/v1/jobs/{jid}/cancel")

        def ok(r: Any) -> None:
            assert w.row(jid).state == "CANCELLED"
        return r, ok
    if action == "hold":
        jid = w.job(team)
        assert w.row(jid).state == "PENDING" and not w.row(jid).held
        r = client.post(f"/api/v1/jobs/{jid}/hold")

        def ok(r: Any) -> None:
            assert w.row(jid).held and w.row(jid).state == "PENDING"
        return r, ok
    if action == "release":
        jid = w.job(team, hold=True)
        r = client.post(f"/api/v1/jobs/{jid}/release")

        def ok(r: Any) -> None:
            assert not w.row(jid).held
        return r, ok
    if action == "requeue":
        jid = w.job(team, hold=True)
        w.set_state(jid, "COMPLETED")
        r = client.post(f"/api/v1/jobs/{jid}/requeue")

        def ok(r: Any) -> None:
            assert w.row(jid).state == "REQUEUED"
        return r, ok
    if action == "logs":
        jid = w.job(team, hold=True)
        secret = f"secret of {team} {uuid.uuid4().hex}"
        logs = job_dir(p.cp.data_dir, jid) / "logs"
        logs.mkdir(parents=True)
        (logs / "rank-0.log").write_text(secret + "\n")
        r = client.get(f"/api/v1/jobs/{jid}/logs")
        if r.status_code == 403:
            assert secret not in r.text

        def ok(r: Any) -> None:
            assert secret in r.text
        return r, ok
    raise AssertionError(action)


def _global_action(w: World, client: Any, action: str) -> tuple[Any, Callable[[Any], None]]:
    p = w.p

    def nothing(r: Any) -> None:
        pass
    simple_reads = {"list": "/api/v1/jobs", "events": "/api/v1/events", "nodes": "/api/v1/nodes",
                    "node": "/api/v1/nodes/node-1", "teams": "/api/v1/teams", "team": "/api/v1/teams/nlp",
                    "config_get": "/api/v1/cluster/config", "config_versions": "/api/v1/cluster/config/versions",
                    "config_diff": "/api/v1/cluster/config/diff?from=1&to=1", "whoami": "/api/v1/whoami",
                    "metrics": "/metrics"}
    if action in simple_reads:
        r = client.get(simple_reads[action])
        if action == "list":
            def ok(r: Any) -> None:
                assert w.home in [j["id"] for j in r.json()["jobs"]]
            return r, ok
        return r, nothing
    if action in ("drain", "resume"):
        p.admin.post("/api/v1/nodes/node-1/" + ("resume" if action == "drain" else "drain"))
        before = w.node_state("node-1")
        r = client.post(f"/api/v1/nodes/node-1/{action}", json={"reason": "test"} if action == "drain" else None)

        def ok(r: Any) -> None:
            assert before != w.node_state("node-1") == ("drain" if action == "drain" else "up")
        return r, ok
    if action == "update_quota":
        n = len(w.config_versions())
        limit = 4 + n % 3
        r = client.put("/api/v1/teams/nlp", json={"quotas": {"default": {"nominal": 4, "borrowing_limit": limit}}})

        def ok(r: Any) -> None:
            assert len(w.config_versions()) == n + 1
            assert r.json()["quotas"]["default"]["borrowing_limit"] == limit
        return r, ok
    if action == "config_apply":
        n = len(w.config_versions())
        text = identity_config_text() + f"\n# {uuid.uuid4().hex}\n"
        r = client.post("/api/v1/cluster/config", json={"text": text, "message": "a comment"})

        def ok(r: Any) -> None:
            assert len(w.config_versions()) == n + 1 and w.config_versions()[-1].text == text
        return r, ok
    if action == "config_rollback":
        p.admin.post("/api/v1/cluster/config", json={"text": identity_config_text() + f"\n# {uuid.uuid4().hex}\n"})
        n = len(w.config_versions())
        r = client.post("/api/v1/cluster/config/rollback", json={"version": 1})

        def ok(r: Any) -> None:
            versions = w.config_versions()
            assert len(versions) == n + 1 and versions[-1].text == versions[0].text
        return r, ok
    if action == "create_token":
        r = client.post("/api/v1/tokens", json={"user": "carol", "role": "member", "team": "nlp"})

        def ok(r: Any) -> None:
            assert r.status_code == 201
            me = p.client(r.json()["token"]).get("/api/v1/whoami").json()
            assert me == {"user": "carol", "role": "member", "team": "nlp", "job_id": None}
        return r, ok
    raise AssertionError(action)


def _expect(w: World, r: Any, ok: Callable[[Any], None], allowed: bool, before: dict[str, Any]) -> None:
    if allowed:
        assert 200 <= r.status_code < 300, r.text[:500]
        ok(r)
    else:
        assert r.status_code == 403, r.text[:500]
        assert r.json()["detail"]
        assert store_snapshot(w.p) == before, "a refused request changed the store"


class Caller:
    """A role's client that snapshots the store just before each request (after the set-up)."""

    def __init__(self, w: World, role: str):
        self.w, self.c, self.before = w, w.clients[role], {}

    def _call(self, method: str, *a: Any, **kw: Any) -> Any:
        self.before = store_snapshot(self.w.p)
        return getattr(self.c, method)(*a, **kw)

    def get(self, *a: Any, **kw: Any) -> Any:
        return self._call("get", *a, **kw)

    def post(self, *a: Any, **kw: Any) -> Any:
        return self._call("post", *a, **kw)

    def put(self, *a: Any, **kw: Any) -> Any:
        return self._call("put", *a, **kw)


@pytest.mark.parametrize("team", TEAMS)
@pytest.mark.parametrize("action", TEAM_ACTIONS)
@pytest.mark.parametrize("role", ROLES)
def test_team_scoped_action(world: World, role: str, action: str, team: str) -> None:
    relation = "own" if team_of(role) == team else "other"
    caller = Caller(world, role)
    r, ok = _team_action(world, caller, action, team)
    _expect(world, r, ok, allowed_team_action(role, action, relation), caller.before)


@pytest.mark.parametrize("action", GLOBAL_ACTIONS)
@pytest.mark.parametrize("role", ROLES)
def test_global_action(world: World, role: str, action: str) -> None:
    caller = Caller(world, role)
    r, ok = _global_action(world, caller, action)
    _expect(world, r, ok, allowed_global_action(role, action), caller.before)


# -- details the matrix does not show -------------------------------------------------------------

@pytest.mark.parametrize("role", ROLES)
def test_private_fields_only_for_those_who_manage_the_job(world: World, role: str) -> None:
    """Everyone sees the queue, but a job's command, workdir and env only to who may manage it."""
    jid = world.p.submit(world.p.admin, team="nlp", hold=True, command=script("print('x')"), env={"KEY": "v"})["id"]
    r = world.clients[role].get(f"/api/v1/jobs/{jid}")
    if role == "job":
        assert r.status_code == 403
        return
    j = r.json()
    if role in ("admin", "operator", "member:nlp"):
        assert j["command"] and j["env"] == {"KEY": "v"} and j["workdir"]
    else:
        assert j["command"] is None and j["env"] is None and j["workdir"] is None
    listed = {x["id"]: x for x in world.clients[role].get("/api/v1/jobs").json()["jobs"]}
    assert listed[jid]["command"] == j["command"] and listed[jid]["env"] == j["env"]


def test_job_token_reads_its_own_job_and_nothing_else(world: World) -> None:
    """The token a running job finds in TRAINYARD_TOKEN: its own job, events and logs; no action."""
    c, home = world.clients["job"], world.home
    assert c.get("/api/v1/whoami").json() == {"user": f"job-{home}", "role": "job", "team": "vision", "job_id": home}
    j = c.get(f"/api/v1/jobs/{home}")
    assert j.status_code == 200 and j.json()["state"] == "RUNNING"
    ev = c.get(f"/api/v1/jobs/{home}/events")
    assert ev.status_code == 200 and "job.started" in [e["kind"] for e in ev.json()["events"]]
    assert c.get("/api/v1/events", params={"job": home}).status_code == 200
    deadline = time.monotonic() + 10
    while "home job log line" not in (logs := c.get(f"/api/v1/jobs/{home}/logs")).text:
        assert logs.status_code == 200, logs.text
        assert time.monotonic() < deadline
        time.sleep(0.05)
    before = store_snapshot(world.p)
    for action in ("cancel", "hold", "release", "requeue"):
        r = c.post(f"/api/v1/jobs/{home}/{action}")
        assert r.status_code == 403, (action, r.text)
    other = world.job("vision", hold=True)
    before = store_snapshot(world.p)
    for path in (f"/api/v1/jobs/{other}", f"/api/v1/jobs/{other}/events", f"/api/v1/jobs/{other}/logs",
                 f"/api/v1/events?job={other}"):
        assert c.get(path).status_code == 403, path
    assert store_snapshot(world.p) == before
    row = world.row(home)
    assert row.state == "RUNNING" and not row.held and row.stop_kind is None


def test_operator_hold_is_marked_as_admin_hold(world: World) -> None:
    jid = world.job("vision")
    assert world.clients["operator"].post(f"/api/v1/jobs/{jid}/hold").json()["reason"] == "JobHeldAdmin"
    jid = world.job("vision")
    assert world.clients["member:vision"].post(f"/api/v1/jobs/{jid}/hold").json()["reason"] == "JobHeldUser"


def test_refused_actions_leave_no_event(world: World) -> None:
    """The audit trail records what happened, not what was refused."""
    jid = world.job("vision", hold=True)
    before = store_snapshot(world.p)
    bob = world.clients["member:nlp"]
    for action in ("cancel", "release", "requeue", "hold"):
        assert bob.post(f"/api/v1/jobs/{jid}/{action}").status_code == 403
    assert bob.post("/api/v1/nodes/node-0/drain", json={"reason": "x"}).status_code == 403
    assert bob.post("/api/v1/tokens", json={"user": "eve", "role": "admin"}).status_code == 403
    assert store_snapshot(world.p) == before


ENDPOINTS = [("GET", "/api/v1/jobs", None), ("POST", "/api/v1/jobs", {"command": ["true"], "team": "vision"}),
             ("GET", "/api/v1/jobs/1", None), ("POST", "/api/v1/jobs/1/cancel", None),
             ("GET", "/api/v1/jobs/1/logs", None), ("GET", "/api/v1/nodes", None),
             ("POST", "/api/v1/nodes/node-1/drain", {"reason": "x"}), ("GET", "/api/v1/teams", None),
             ("PUT", "/api/v1/teams/nlp", {"quotas": {"default": {"nominal": 1}}}),
             ("GET", "/api/v1/cluster/config", None), ("POST", "/api/v1/cluster/config/rollback", {"version": 1}),
             ("POST", "/api/v1/tokens", {"user": "eve", "role": "admin"}), ("GET", "/api/v1/events", None),
             ("GET", "/api/v1/whoami", None)]


@pytest.mark.parametrize("auth", [None, "Bearer ty_not-a-real-token", "Bearer ", "Basic YWRtaW46YWRtaW4=",
                                  "ty_no-scheme"])
@pytest.mark.parametrize("method,path,body", ENDPOINTS, ids=[f"{m} {p}" for m, p, _ in ENDPOINTS])
def test_no_or_bad_token_is_401(world: World, auth: str | None, method: str, path: str, body: Any) -> None:
    before = store_snapshot(world.p)
    headers = {"Authorization": auth} if auth is not None else {}
    r = world.p.http.request(method, path, json=body, headers=headers)
    assert r.status_code == 401, r.text
    assert r.json()["detail"]
    assert store_snapshot(world.p) == before


def test_admin_token_bytes_as_bearer_of_other_scheme_is_refused(world: World) -> None:
    """The real admin token under another scheme is not accepted either."""
    r = world.p.http.get("/api/v1/whoami", headers={"Authorization": f"Token {world.p.admin_token}"})
    assert r.status_code == 401
    r = world.p.http.get("/api/v1/whoami", headers={"Authorization": f"bearer {world.p.admin_token}"})
    assert r.status_code == 200  # the scheme is case-insensitive (RFC 7235)


def test_healthz_and_readyz_need_no_token(world: World) -> None:
    # This plane's loop is not started (see the module docstring): /healthz says so, without a token.
    r = world.p.http.get("/healthz")
    assert r.status_code == 503 and r.json()["checks"]["loop"] == {"ok": False, "detail": "the control loop is not running"}
    assert r.json()["checks"]["store"]["ok"] is True
    assert world.p.http.get("/readyz").status_code in (200, 503)


@pytest.mark.parametrize("releaser,allowed", [("member:vision", False), ("operator", True), ("admin", True)])
def test_an_operator_hold_is_released_by_operators_only(world: World, releaser: str, allowed: bool) -> None:
    """As in Slurm: a member cannot undo the hold an on-call operator put on a team job (JobHeldAdmin)."""
    jid = world.job("vision")
    assert world.clients["operator"].post(f"/api/v1/jobs/{jid}/hold").json()["reason"] == "JobHeldAdmin"
    before = store_snapshot(world.p)
    r = world.clients[releaser].post(f"/api/v1/jobs/{jid}/release")
    if allowed:
        assert r.status_code == 200 and not world.row(jid).held
    else:
        assert r.status_code == 403, r.text
        assert "JobHeldAdmin" in r.json()["detail"]
        assert store_snapshot(world.p) == before
    # a member's own hold, the member releases
    jid = world.job("vision")
    world.clients["member:vision"].post(f"/api/v1/jobs/{jid}/hold")
    assert world.clients["member:vision"].post(f"/api/v1/jobs/{jid}/release").status_code == 200
