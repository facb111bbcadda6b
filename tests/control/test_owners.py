"""Jobs run as their owners (issue 15), with real Unix accounts made for the test (tests/accounts.py).

Two teams with a Unix group each (vision: group `vis`, nlp: group `nlp`), alice in vision, bob in
nlp, token users mapped to the accounts with `users:`. The plane is the real one (in this process,
local backend, real rank processes) on a data dir every account may pass through, started without
the run_as/allow_root_jobs the other tests use.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.accounts import ROOT_ONLY, Accounts
from tests.api.helpers import store_snapshot
from tests.plane import Plane, job_dir
from tests.security.hostile import config_text, root_plane, two_accounts
from trainyard.jobfs import read_record as read_json

pytestmark = ROOT_ONLY

DENIED = "Permission denied"


@pytest.fixture(scope="module")
def acc() -> Iterator[Accounts]:
    with two_accounts() as a:
        yield a


@pytest.fixture(scope="module")
def plane(acc: Accounts) -> Iterator[Plane]:
    with root_plane(acc, "ty-owners-") as p:
        yield p


def log_of(p: Plane, job_id: int, rank: int = 0) -> str:
    """The rank's log, "" before it exists: a job reads RUNNING from the commit that starts its
    attempt, and its job dir and logs are made just after, outside the store's lock."""
    try:
        return (job_dir(p.cp.data_dir, job_id) / "logs" / f"rank-{rank}.log").read_text()
    except FileNotFoundError:
        return ""


def test_a_job_runs_as_its_owner_with_the_teams_group_and_cannot_read_the_plane_or_another_team(plane, acc):
    p = plane
    alice = p.as_user("alice", "member", "vision")
    bob = p.as_user("bob", "member", "nlp")
    secret = "s3cr3t-" + acc.prefix
    # bob's job: a log line, a checkpoint, and a secret in its environment; it stays running.
    b = p.submit(bob, command=["/bin/sh", "-c", 'echo bob-was-here; echo x > "$TRAINYARD_CHECKPOINT_DIR/b"; '
                                                'exec sleep 60'], env={"BOB_SECRET": secret})["id"]
    p.wait(b, "RUNNING")
    bdir = job_dir(p.cp.data_dir, b)
    deadline = time.monotonic() + 120
    while not (rec := read_json(bdir / "run" / "attempt-1" / "rank-0.json")) or "bob-was-here" not in log_of(p, b):
        assert time.monotonic() < deadline, log_of(p, b)
        time.sleep(0.05)
    bob_pid = rec["child_pid"]
    data = p.cp.data_dir
    probe = "; ".join([
        "id -un", "id -Gn",
        'echo token=${TRAINYARD_TOKEN:+set}',
        f"ls {bdir} 2>&1", f"cat {bdir}/logs/rank-0.log 2>&1", f"ls {bdir}/checkpoints 2>&1",
        f"cat {data}/trainyard.db 2>&1 | head -c 100", f"cat {data}/admin.token 2>&1", f"ls {data} 2>&1",
        f"cat /proc/{bob_pid}/environ 2>&1 >/dev/null",
        'echo ckpt > "$TRAINYARD_CHECKPOINT_DIR/mine" && echo wrote-checkpoint',
    ])
    a = p.submit(alice, command=["/bin/sh", "-c", probe])["id"]
    assert p.wait(a, ("COMPLETED", "FAILED"))["state"] == "COMPLETED", log_of(p, a)
    lines = log_of(p, a).splitlines()[1:]  # after the plane's start marker
    assert lines[0] == acc.user("alice")
    assert acc.group("vis") in lines[1].split() and acc.group("nlp") not in lines[1].split()
    assert lines[2] == "token=set"  # the job-scoped token reaches the job through its environment
    denied = [ln for ln in lines if DENIED in ln]
    for what in (f"{bdir}", f"{bdir}/logs/rank-0.log", f"{bdir}/checkpoints", f"{data}/trainyard.db",
                 f"{data}/admin.token", f"{data}", f"/proc/{bob_pid}/environ"):
        assert any(what in ln for ln in denied), (what, lines)
    assert "bob-was-here" not in log_of(p, a) and secret not in log_of(p, a)
    assert lines[-1] == "wrote-checkpoint"
    # What the job wrote is alice's, in the team's group; the job dir is the plane's.
    adir = job_dir(data, a)
    st = (adir / "checkpoints" / "mine").stat()
    assert (st.st_uid, st.st_gid) == (acc.uid("alice"), acc.gid("vis"))
    root = adir.stat()
    assert (root.st_uid, root.st_gid, stat.S_IMODE(root.st_mode)) == (0, acc.gid("vis"), 0o750)
    ex = (adir / "exports").stat()  # where a recipe's relative export: goes: hers (issue 35)
    assert (ex.st_uid, ex.st_gid, stat.S_IMODE(ex.st_mode)) == (acc.uid("alice"), acc.gid("vis"), 0o2750)
    log = (adir / "logs" / "rank-0.log").stat()
    assert (log.st_uid, log.st_gid, stat.S_IMODE(log.st_mode)) == (acc.uid("alice"), acc.gid("vis"), 0o640)
    for name in ("trainyard.db", "admin.token"):
        assert stat.S_IMODE((data / name).stat().st_mode) == 0o600
    assert stat.S_IMODE(data.stat().st_mode) == 0o711
    p.admin.post(f"/api/v1/jobs/{b}/cancel")
    p.wait(b, "CANCELLED")


def test_the_job_token_works_and_a_member_reads_only_its_own_teams_logs(plane, acc):
    p = plane
    alice = p.as_user("alice", "member", "vision")
    bob = p.as_user("bob", "member", "nlp")
    a = p.submit(alice, command=["/bin/sh", "-c", 'echo "token=$TRAINYARD_TOKEN"; exec sleep 60'])["id"]
    p.wait(a, "RUNNING")
    deadline = time.monotonic() + 120
    while not (m := re.search(r"token=(\S+)", log_of(p, a))):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    job = p.client(m.group(1))
    assert job.get(f"/api/v1/jobs/{a}").status_code == 200  # the job reads itself with its own token
    assert alice.get(f"/api/v1/jobs/{a}/logs").status_code == 200
    r = bob.get(f"/api/v1/jobs/{a}/logs")
    assert r.status_code == 403 and "cannot read the logs" in r.json()["detail"]
    p.admin.post(f"/api/v1/jobs/{a}/cancel")
    p.wait(a, "CANCELLED")


def test_a_token_user_without_an_account_is_refused_at_submit_and_nothing_is_stored(plane, acc):
    p = plane
    carol = p.as_user("carol-" + acc.prefix, "member", "vision")
    before = store_snapshot(p)
    r = carol.post("/api/v1/jobs", json={"command": ["true"], "workdir": str(p.cp.data_dir)})
    assert r.status_code == 403, r.text
    assert r.json()["field"] == "user" and f"'carol-{acc.prefix}' has no Unix account" in r.json()["detail"]
    assert store_snapshot(p) == before
    # The admin token's user ("admin") has no account either: no job runs as a stand-in.
    r = p.admin.post("/api/v1/jobs", json={"command": ["true"], "team": "vision", "workdir": str(p.cp.data_dir)})
    assert r.status_code == 403 and "'admin' has no Unix account" in r.json()["detail"]


def test_root_only_with_allow_root_jobs_and_not_beyond_the_teams_group(plane, acc):
    p = plane
    root = p.as_user("root", "member", "vision")  # a token user named after an account: root
    r = root.post("/api/v1/jobs", json={"command": ["true"], "workdir": str(p.cp.data_dir)})
    assert r.status_code == 403 and "allow_root_jobs: true" in r.json()["detail"], r.text
    # bob is no member of vision's group: a bob token of team vision does not get it.
    r = p.as_user("bob", "member", "vision").post("/api/v1/jobs", json={"command": ["true"],
                                                                        "workdir": str(p.cp.data_dir)})
    assert r.status_code == 403 and f"not a member of Unix group {acc.group('vis')!r}" in r.json()["detail"]


@pytest.mark.parametrize("edit,field", [
    (lambda t, a: t + "  carol: nosuch" + a.prefix + "\n", "users.carol"),
    (lambda t, a: t + "  eve: root\n", "users.eve"),
    (lambda t, a: t.replace(f"group: {a.group('nlp')}", f"group: {a.prefix}none"), "teams.1.group"),
    (lambda t, a: t + "run_as: nosuch" + a.prefix + "\n", "run_as"),
])
def test_a_configuration_naming_what_this_machine_lacks_is_refused_naming_the_entry(plane, acc, edit, field):
    p = plane
    before = store_snapshot(p)
    r = p.admin.post("/api/v1/cluster/config", json={"text": edit(config_text(acc), acc)})
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field and f"'{field}'" in r.json()["detail"]
    assert store_snapshot(p) == before


def test_a_workdir_the_owner_cannot_enter_is_refused_at_submit(plane, acc, tmp_path: Path):
    closed = tmp_path / "closed"  # under pytest's 0700 root-only tmp dir
    closed.mkdir()
    r = p_submit(plane, "alice", "vision", workdir=str(closed))
    assert r.status_code == 400 and r.json()["field"] == "workdir" and acc.user("alice") in r.json()["detail"]


def p_submit(p: Plane, user: str, team: str, **body: object):
    return p.as_user(user, "member", team).post("/api/v1/jobs", json={"command": ["true"], **body})


def test_the_start_lines_say_who_jobs_run_as(plane):
    assert any("jobs run as their owners" in n for n in plane.cp.notes)
    assert os.geteuid() == 0


def test_output_links_in_the_owners_workdir_belong_to_the_owner(plane, acc):
    p = plane
    wd = p.cp.data_dir.parent / f"work-{acc.prefix}"
    wd.mkdir()
    os.chown(wd, acc.uid("alice"), acc.gid("vis"))
    alice = p.as_user("alice", "member", "vision")
    j = p.submit(alice, command=["/bin/sh", "-c", "echo to-the-link"], workdir=str(wd), output="out/%j.log")["id"]
    assert p.wait(j, ("COMPLETED", "FAILED"))["state"] == "COMPLETED"
    link = wd / "out" / f"{j}.log"
    assert link.is_symlink() and "to-the-link" in link.read_text()
    for path in (wd / "out", link):
        assert os.lstat(path).st_uid == acc.uid("alice"), path
