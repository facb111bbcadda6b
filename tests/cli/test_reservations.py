"""Admin reservations (issue 17, item 3): `yard reservation create/list/delete`, honoured by the
engine, and `yard submit --reservation` (also `#SBATCH --reservation`). Real `yard` processes
against a real `yard up` (two emulated nodes of 4 GPUs, node-0 and node-1; teams vision and nlp)."""

from __future__ import annotations

import json
import time

import pytest

from tests.cli.yard_process import job_id_of, stored, yard_process

SLEEP = ["--", "sleep", "300"]


# One worker for this module's tests under `make test`'s --dist loadgroup: its module-scoped
# yard up starts once, not once per worker (about 4 s of CPU each).
pytestmark = pytest.mark.xdist_group("cli-reservations")


@pytest.fixture(scope="module")
def yard(tmp_path_factory):
    yield from yard_process(tmp_path_factory, "reservations")


@pytest.fixture(scope="module")
def members(yard):
    return {team: yard("token", "create", "--user", user, "--role", "member", "--team", team).stdout.strip()
            for team, user in (("nlp", "carol"), ("vision", "victor"))}


def as_member(yard, members, team):
    return lambda *a, **kw: yard(*a, env_extra={"YARD_TOKEN": members[team]}, **kw)


def show(yard, jid: int) -> dict:
    return json.loads(yard("show", str(jid), "--json").stdout)


def wait(yard, jid: int, pred, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        j = show(yard, jid)
        if pred(j):
            return j
        assert time.monotonic() < deadline, j
        time.sleep(0.2)


def nodes_of(j: dict) -> set[str]:
    return {p["node"] for p in j["placement"] or []}


def version(yard) -> int:
    return json.loads(yard("cluster", "get", "--json").stdout)["version"]


def reservations(yard) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads(yard("reservation", "list", "--json").stdout)}


def cancel_all(yard) -> None:
    for j in json.loads(yard("queue", "--json").stdout):
        yard("cancel", str(j["id"]), ok=False)
    deadline = time.monotonic() + 30
    while json.loads(yard("queue", "--json").stdout):
        assert time.monotonic() < deadline
        time.sleep(0.2)


@pytest.mark.parametrize("args, says", [
    (["--nodes", "node-[0", "--start", "now", "--duration", "1h", "--teams", "nlp"], "--nodes: hostlist"),
    (["--nodes", "node-7", "--start", "now", "--duration", "1h", "--teams", "nlp"], "unknown node 'node-7'"),
    (["--nodes", "node-[0-2]", "--start", "now", "--duration", "1h", "--teams", "nlp"], "unknown node 'node-2'"),
    (["--nodes", "node-0", "--start", "soon", "--duration", "1h", "--teams", "nlp"], "--start: cannot read 'soon'"),
    (["--nodes", "node-0", "--start", "2026-13-02T10:00", "--duration", "1h", "--teams", "nlp"], "--start:"),
    (["--nodes", "node-0", "--start", "now+3parsecs", "--duration", "1h", "--teams", "nlp"], "--start: unknown unit"),
    (["--nodes", "node-0", "--start", "now", "--duration", "0", "--teams", "nlp"], "--duration: must be positive"),
    (["--nodes", "node-0", "--start", "now", "--duration=-5", "--teams", "nlp"], "--duration:"),
    (["--nodes", "node-0", "--start", "now", "--duration", "soon", "--teams", "nlp"], "--duration:"),
    (["--nodes", "node-0", "--start", "now", "--duration", "1h", "--teams", "speech"], "unknown team 'speech'"),
    (["--nodes", "node-0", "--start", "now", "--duration", "1h", "--users", "nobody"], "unknown user 'nobody'"),
    (["--nodes", "node-0", "--start", "now", "--duration", "1h"], "--users/--teams"),
    (["--nodes", "node-0", "--start", "2020-01-01T00:00", "--duration", "1h", "--teams", "nlp"], "in the past"),
])
def test_bad_input_is_refused_naming_the_option_and_nothing_is_stored(yard, args, says):
    before = version(yard)
    p = yard("reservation", "create", *args, ok=False)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and says in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert version(yard) == before and reservations(yard) == {}


def test_only_an_admin_creates_and_deletes(yard, members):
    nlp = as_member(yard, members, "nlp")
    p = nlp("reservation", "create", "--nodes", "node-0", "--start", "now", "--duration", "1h", "--teams", "nlp", ok=False)
    assert p.returncode == 2 and "only an admin" in p.stderr, p.stderr
    yard("reservation", "create", "--nodes", "node-0", "--start", "now+5hours", "--duration", "1h", "--teams", "nlp",
         "--name", "later")
    assert "later" in nlp("reservation", "list").stdout  # members may read them
    p = nlp("reservation", "delete", "later", ok=False)
    assert p.returncode == 2 and "only an admin" in p.stderr
    p = yard("reservation", "delete", "nosuch", ok=False)
    assert p.returncode == 2 and "no reservation 'nosuch'" in p.stderr
    # a name in use, and nodes another reservation holds then, are refused too
    p = yard("reservation", "create", "--nodes", "node-1", "--start", "now", "--duration", "1h", "--teams", "nlp",
             "--name", "later", ok=False)
    assert p.returncode == 2 and "exists" in p.stderr
    p = yard("reservation", "create", "--nodes", "node-[0-1]", "--start", "now+5hours", "--duration", "30m",
             "--teams", "nlp", ok=False)
    assert p.returncode == 2 and "held by reservation 'later'" in p.stderr
    assert "reservation later deleted" in yard("reservation", "delete", "later").stdout
    assert reservations(yard) == {}


def test_create_list_delete_each_a_configuration_version(yard, members):  # members: carol must exist
    v = version(yard)
    out = yard("reservation", "create", "--nodes", "node-[0-1]", "--start", "now+2hours", "--duration", "90",
               "--users", "carol", "--teams", "vision", "--name", "maint", "-m", "firmware").stdout
    assert out.startswith("reservation maint created: node-[0-1] from ") and "(planned;" in out, out
    r = reservations(yard)["maint"]
    assert r["nodes"] == "node-[0-1]" and r["duration_s"] == 90 * 60 and r["users"] == ["carol"]
    assert r["teams"] == ["vision"] and r["state"] == "planned" and abs(r["start"] - time.time() - 7200) < 60
    listing = yard("reservation", "list").stdout.splitlines()
    assert listing[0].split() == ["NAME", "STATE", "NODES", "START", "END", "USERS", "TEAMS"]
    assert listing[1].split()[:3] == ["maint", "planned", "node-[0-1]"]
    last = max(json.loads(yard("cluster", "history", "--json").stdout), key=lambda h: h["version"])
    assert last["version"] == v + 1 and last["message"] == "firmware"
    assert "reservations:" in json.loads(yard("cluster", "get", "--json").stdout)["text"]
    yard("reservation", "delete", "maint")
    assert version(yard) == v + 2 and reservations(yard) == {}


def test_jobs_in_a_reservation_and_jobs_kept_off_it(yard, members, tmp_path):
    nlp, vision = as_member(yard, members, "nlp"), as_member(yard, members, "vision")
    yard("reservation", "create", "--nodes", "node-1", "--start", "now", "--duration", "30m", "--teams", "nlp",
         "--name", "nlp-demo")
    assert reservations(yard)["nlp-demo"]["state"] == "active"
    # Another team's job is refused at submit, and an unknown reservation too: exit 2, nothing stored.
    before = stored(yard)
    p = vision("submit", "--reservation", "nlp-demo", "-G", "1", *SLEEP, ok=False)
    assert p.returncode == 2 and "not for user 'victor' or team 'vision'" in p.stderr, p.stderr
    p = nlp("submit", "--reservation", "nosuch", "-G", "1", *SLEEP, ok=False)
    assert p.returncode == 2 and "unknown reservation 'nosuch'" in p.stderr, p.stderr
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --reservation=nosuch\nsleep 1\n")
    p = nlp("submit", str(script), ok=False, cwd=tmp_path)
    assert p.returncode == 2 and "unknown reservation 'nosuch'" in p.stderr, p.stderr
    assert stored(yard) == before
    # Plain jobs: the first takes node-0; the second would fit node-1, which is reserved.
    a = job_id_of(vision("submit", "-G", "4", "--time", "10", *SLEEP))
    assert nodes_of(wait(yard, a, lambda j: j["state"] == "RUNNING")) == {"node-0"}
    b = job_id_of(vision("submit", "-G", "4", "--time", "10", *SLEEP))
    j = wait(yard, b, lambda j: j["reason"] != "None")
    assert j["state"] == "PENDING" and j["reason"] == "ReqNodeNotAvail, Reserved for maintenance", j
    assert "ReqNodeNotAvail" in yard("queue", "-o", "%i %R").stdout
    # The reservation's team runs in it, on its node, from a batch script as well.
    script.write_text("#!/bin/bash\n#SBATCH --reservation=nlp-demo\n#SBATCH -G 2\nsleep 300\n")
    c = job_id_of(nlp("submit", str(script), cwd=tmp_path))
    d = job_id_of(nlp("submit", "--reservation", "nlp-demo", "-G", "2", *SLEEP))
    for jid in (c, d):
        j = wait(yard, jid, lambda j: j["state"] == "RUNNING")
        assert nodes_of(j) == {"node-1"} and j["reservation"] == "nlp-demo", j
    assert show(yard, b)["state"] == "PENDING"
    # Deleted, it holds nothing: b runs once node-1 is free; a job still waiting in it says so.
    e = job_id_of(nlp("submit", "--reservation", "nlp-demo", "-G", "2", *SLEEP))
    wait(yard, e, lambda j: j["reason"] not in ("None", ""))
    yard("reservation", "delete", "nlp-demo")
    assert wait(yard, e, lambda j: j["reason"] == "ReservationDeleted")["state"] == "PENDING"
    for jid in (c, d, e):
        yard("cancel", str(jid))
    assert nodes_of(wait(yard, b, lambda j: j["state"] == "RUNNING")) == {"node-1"}
    cancel_all(yard)


def test_a_job_that_would_run_into_a_future_reservation_does_not_start(yard, members):
    nlp, vision = as_member(yard, members, "nlp"), as_member(yard, members, "vision")
    yard("reservation", "create", "--nodes", "node-[0-1]", "--start", "now+1hour", "--duration", "1h",
         "--teams", "nlp", "--name", "soon")
    long = job_id_of(vision("submit", "-G", "1", "--time", "2:00:00", *SLEEP))
    unlimited = job_id_of(vision("submit", "-G", "1", *SLEEP))  # no limit; the class has no max run time
    short = job_id_of(vision("submit", "-G", "1", "--time", "30", *SLEEP))
    assert wait(yard, short, lambda j: j["state"] == "RUNNING")
    for jid in (long, unlimited):
        j = wait(yard, jid, lambda j: j["reason"] != "None")
        assert j["state"] == "PENDING" and j["reason"] == "ReqNodeNotAvail, Reserved for maintenance", j
    # A job for the reservation waits for its start, which is its estimated start.
    inside = job_id_of(nlp("submit", "--reservation", "soon", "-G", "1", *SLEEP))
    j = wait(yard, inside, lambda j: j["reason"] != "None")
    start = reservations(yard)["soon"]["start"]
    assert j["state"] == "PENDING" and j["reason"] == "Reservation" and j["est_start"] == start, j
    yard("reservation", "delete", "soon")
    assert wait(yard, long, lambda j: j["state"] == "RUNNING")
    assert wait(yard, unlimited, lambda j: j["state"] == "RUNNING")
    cancel_all(yard)


def test_an_expired_reservation_frees_its_nodes(yard, members):
    vision = as_member(yard, members, "vision")
    yard("reservation", "create", "--nodes", "node-[0-1]", "--start", "now", "--duration", "8s", "--teams", "nlp",
         "--name", "brief")
    t0 = time.time()
    jid = job_id_of(vision("submit", "-G", "4", "--time", "10", *SLEEP))
    j = show(yard, jid)
    if time.time() - t0 < 5:  # still active when it was looked at
        j = wait(yard, jid, lambda j: j["reason"] != "None" or j["state"] == "RUNNING")
        assert j["state"] == "PENDING" and j["reason"].startswith("ReqNodeNotAvail"), j
    j = wait(yard, jid, lambda j: j["state"] == "RUNNING", timeout=60)
    assert j["start_time"] >= reservations(yard)["brief"]["end"] - 1
    assert reservations(yard)["brief"]["state"] == "ended"
    p = as_member(yard, members, "nlp")("submit", "--reservation", "brief", "-G", "1", *SLEEP, ok=False)
    assert p.returncode == 2 and "reservation 'brief' ended" in p.stderr, p.stderr
    yard("reservation", "delete", "brief")
    cancel_all(yard)
