"""The lifecycle rules delete what a job's owner controls (issue 41): a root plane, a real account
(`useradd`), a real job that leaves a hostile tree in its checkpoints (the owner's part of its
job dir; `logs/` is the plane's) — a link to a root-owned file and to that file's directory, a
FIFO, a directory it made unreadable — and a rule that deletes its job dir. The plane counts and
removes that tree through directory descriptors only: the root-owned file and its directory stay,
and the event's bytes are what was there (no link followed, the FIFO never opened)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import select

from tests.accounts import ROOT_ONLY, Accounts, accounts, shared_dir
from tests.plane import TWO_TEAMS, Plane, job_dir
from tests.services.test_retention_rules import apparent
from trainyard.store.models import EventRow

pytestmark = ROOT_ONLY

HOSTILE = ('set -e; echo hello; C="$TRAINYARD_CHECKPOINT_DIR"; head -c 4096 /dev/urandom > "$C/w.pt"; '
           'ln -s {target} "$C/to-root"; ln -s {outside} "$C/to-dir"; mkfifo "$C/fifo"; '
           'mkdir -p "$C/locked/deep" && echo x > "$C/locked/deep/f" && chmod 000 "$C/locked"')


@pytest.fixture(scope="module")
def acc() -> Iterator[Accounts]:
    with accounts({"alice": ["vis"]}, ["vis"]) as a:
        yield a


def test_a_hostile_log_tree_is_counted_and_removed_without_following_anything(acc):
    with shared_dir("ty-retention-") as d:
        outside = d / "root-owned"
        outside.mkdir()
        target = outside / "file.txt"
        target.write_text("the plane's, not the job's")
        cfg = d / "cluster.yaml"
        cfg.write_text(TWO_TEAMS.read_text().replace("  - name: vision\n", f"  - name: vision\n    group: "
                                                     f"{acc.group('vis')}\n    storage: {{lifecycle: {{job_dirs: 1s}}}}\n")
                       + f"users:\n  alice: {acc.user('alice')}\n")
        p = Plane(d / "yard", config=cfg, run_as=None, allow_root_jobs=None)
        try:
            alice = p.as_user("alice", "member", "vision")
            jid = p.submit(alice, command=["/bin/sh", "-c", HOSTILE.format(target=target, outside=outside)])["id"]
            root = job_dir(p.cp.data_dir, jid)
            j = p.wait(jid, ("COMPLETED", "FAILED"), timeout=60)
            assert j["state"] == "COMPLETED", (j, [(f, f.read_text()) for f in (root / "logs").glob("*.log")])
            assert os.lstat(root / "checkpoints" / "to-root").st_uid == acc.uid("alice")
            assert os.stat(root / "checkpoints" / "locked").st_mode & 0o777 == 0
            nbytes, deadline = -1, time.monotonic() + 30
            while nbytes != (nbytes := apparent(root)):  # the attempt's run state released; past the rule
                assert time.monotonic() < deadline
                time.sleep(1.2)  # as root, os.walk lists the locked directory too, and follows no link
            p.cp.retention.run_once()
            assert not root.exists() and list((p.cp.data_dir / "jobs").iterdir()) == []
            assert target.read_text() == "the plane's, not the job's" and sorted(os.listdir(outside)) == ["file.txt"]
            with p.cp.store.session() as s:
                [e] = s.scalars(select(EventRow).where(EventRow.kind == "retention.deleted")).all()
            assert (e.job_id, e.data["what"], e.data["bytes"], e.data["complete"]) == (jid, "job_dir", nbytes, True)
        finally:
            p.stop()
