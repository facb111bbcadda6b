"""The catalogue (services/datasets.py) with real Unix accounts: a member's path source is read as
that member's account, so the plane (root) never records, hashes or later copies a file the member
could not read; an admin's is read as the plane. And the order of versions."""

from __future__ import annotations

import json
import os
import pwd


from tests.accounts import ROOT_ONLY, accounts, shared_dir
from tests.plane import TWO_TEAMS, Plane
from trainyard.services.datasets import version_key


def test_versions_compare_as_a_person_reads_them():
    ordered = ["1", "1.9", "1.10", "2", "v1", "v2", "v10", "v10a"]
    assert sorted(reversed(ordered), key=version_key) == ordered


@ROOT_ONLY
def test_a_member_adds_only_what_their_account_may_read(tmp_path):
    with accounts({"alice": [], "bob": []}, []) as acc, shared_dir("ty-ds-") as d:
        alice, bob = pwd.getpwnam(acc.user("alice")), pwd.getpwnam(acc.user("bob"))
        hers = d / "hers.jsonl"
        hers.write_text('{"a": 1}\n')
        os.chown(hers, alice.pw_uid, alice.pw_gid)
        hers.chmod(0o600)
        his = d / "his.jsonl"
        his.write_text('{"secret": 1}\n')
        os.chown(his, bob.pw_uid, bob.pw_gid)
        his.chmod(0o600)
        cfg = tmp_path / "cluster.yaml"
        cfg.write_text(TWO_TEAMS.read_text() + f"users: {json.dumps({'alice': alice.pw_name, 'bob': bob.pw_name})}\n")
        p = Plane(tmp_path / "data", config=cfg, start=False)
        try:
            member = p.as_user("alice", "member", "nlp")
            r = member.post("/api/v1/datasets", json={"name": "hers", "version": "1", "source": str(hers)})
            assert r.status_code == 201, r.text
            r = member.post("/api/v1/datasets", json={"name": "his", "version": "1", "source": str(his)})
            assert r.status_code == 422 and r.json()["field"] == "source" and "forbidden" in r.text, r.text
            assert [d["name"] for d in p.admin.get("/api/v1/datasets").json()["datasets"]] == ["hers"]
            r = p.admin.post("/api/v1/datasets", json={"name": "his", "version": "1", "source": str(his),
                                                       "team": "vision"})
            assert r.status_code == 201, r.text  # an admin's: read as the plane, as the configuration's are
            job = p.submit(member, command=["true"], datasets=["hers"], hold=True, workdir=str(d))
            reader = p.job(job["id"])["datasets"][0]["reader"]
            assert (reader["uid"], reader["gid"]) == (alice.pw_uid, alice.pw_gid)
            assert alice.pw_gid in reader["groups"]
            job = p.submit(p.admin, team="vision", command=["true"], datasets=["his"], hold=True, workdir=str(d))
            assert p.job(job["id"])["datasets"][0]["reader"] is None
        finally:
            p.stop()
