"""Property-based fuzzing of the whole API from its OpenAPI spec (schemathesis): never a 5xx.

Each operation gets a bounded number of generated requests with an admin token, against a real
plane whose loop runs, so generated jobs that pass validation are scheduled and started. They
cannot do harm: the plane has one team (a body without `team` is accepted, which lets the
generator reach the happy path), ranks run in a scratch directory with an empty PATH and HOME
(a generated program name exits 127), and before a submission is sent its few fields that could
reach outside the scratch directory are replaced with harmless values: a path as the program, a
shell script, an absolute, `..` or `%x` output path, env names (PATH, BASH_ENV, LD_PRELOAD...).
Images may come only from a closed loopback port (`allowed_registries` of `images:`): nothing is pulled
from the network.
Log streaming (`follow`) is switched off: it waits for a job's end by design.

`make test` runs the same 25 examples per operation every time (`tests/hypothesis_setup.py`). To
search longer with fresh examples:
`HYPOTHESIS_PROFILE=explore HYPOTHESIS_SCALE=12 .venv/bin/pytest tests/api/test_schemathesis.py`.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from tests.plane import TWO_TEAMS, Plane, script
from trainyard.api.app import create_app
from tests.hypothesis_setup import examples

# The spec does not depend on the plane (create_app only stores it), so it is built once, here.
schema = schemathesis.openapi.from_dict(create_app(None).openapi())  # type: ignore[arg-type]

ONE_TEAM = yaml.safe_load(TWO_TEAMS.read_text())
ONE_TEAM["teams"] = [{"name": "lab", "quotas": {"default": {"nominal": 8}}}]
# images only from a loopback port where nothing listens: a generated image (a submission's, or
# one `yard image pull` is asked for) is refused (403) before anything is pulled, never fetched
# from a registry on the network; the few that name this one find it closed (unreachable)
ONE_TEAM["images"] = {"allowed_registries": ["127.0.0.1:9"]}


class Fuzzed:
    def __init__(self, p: Plane, scratch: Path):
        self.p, self.scratch = p, scratch


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("schemathesis")
    config = root / "one_team.yaml"
    config.write_text(yaml.safe_dump(ONE_TEAM, sort_keys=False))
    scratch, empty = root / "scratch", root / "empty-path"
    scratch.mkdir()
    empty.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", str(empty))  # ranks inherit it: a generated program name is not found
        mp.setenv("HOME", str(scratch))
        p = Plane(root / "data", config=config, kill_wait_s=1.0)
        try:
            # a few jobs to act on: ids 1..4, in several states
            for i in range(4):
                p.submit(p.admin, command=script(f"print({i})"), workdir=str(scratch), hold=i % 2 == 1)
            yield Fuzzed(p, scratch)
        finally:
            p.stop()  # also fails if any pass of the control loop failed


def _harmless_submit(body: Any, scratch: Path) -> Any:
    """Keep the generated submission as it is, except what could reach outside the scratch dir."""
    if not isinstance(body, dict):
        return body
    body = dict(body)
    wd = body.get("workdir")
    if not wd or (isinstance(wd, str) and "\x00" not in wd and os.path.isdir(wd)):
        body["workdir"] = str(scratch)  # not the data dir either: `output` there could replace its files
    cmd = body.get("command")
    if isinstance(cmd, list) and cmd and isinstance(cmd[0], str) and "/" in cmd[0]:
        body["command"] = ["no-such-program", *cmd[1:]]
    if isinstance(body.get("script"), str) and body["script"]:
        body["script"] = "exit 3\n"
    out = body.get("output")
    if isinstance(out, str) and (out.startswith("/") or ".." in out or "%x" in out):  # %x: the job's name
        body["output"] = "out-%j.log"
    env = body.get("env")
    if isinstance(env, dict):  # no PATH, LD_PRELOAD, BASH_ENV...; an empty name stays (it must be refused)
        body["env"] = {(f"FUZZ_{k}" if isinstance(k, str) and k else k): v for k, v in env.items()}
    return body


def _steer(case: Any) -> None:
    """Random names rarely hit a known node, team, class or job: for two cases in three, put known
    ones in, so that generated requests also get past the lookups into the code behind them."""
    if zlib.crc32(repr((case.path, case.path_parameters, case.query, case.body)).encode()) % 3 == 0:
        return
    params = dict(case.path_parameters or {})
    if "name" in params:
        params["name"] = "lab" if case.path.startswith("/api/v1/teams") else f"node-{len(str(params['name'])) % 2}"
    if "job_id" in params and isinstance(params["job_id"], int):
        params["job_id"] = 1 + abs(params["job_id"]) % 12
    case.path_parameters = params
    if isinstance(case.body, dict):
        body = dict(case.body)
        for key, known in (("team", "lab"), ("class", "batch"), ("pool", "default"), ("role", "viewer")):
            if key in body:
                body[key] = known
        if case.path == "/api/v1/jobs" and not body.get("command") and not body.get("script"):
            body["command"] = ["no-such-program"]
        case.body = body


@schema.parametrize()
@settings(max_examples=examples(25), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
def test_no_server_error(case: Any, fuzzed: Fuzzed) -> None:
    headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
    headers["Authorization"] = f"Bearer {fuzzed.p.admin_token}"
    case.headers = headers
    _steer(case)
    if case.method == "POST" and case.path == "/api/v1/jobs":
        case.body = _harmless_submit(case.body, fuzzed.scratch)
    if case.path.endswith("/logs") and case.query:
        case.query = {k: v for k, v in case.query.items() if k != "follow"}
    response = case.call(app=fuzzed.p.app)
    case.validate_response(response, checks=[not_a_server_error])
    stats = fuzzed.p.cp.loop.stats  # what the requests stored must not break the control loop either
    assert stats.errors == 0, f"the control loop failed after {case.method} {case.path}: {stats.last_error}"

