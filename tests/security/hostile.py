"""A root plane and two hostile-or-not members for the red-team tests: real Unix accounts (alice in
team vision, bob in nlp, each team with its Unix group), the real plane in this process on a data
dir every account may pass through, and each member's own home-like directory to work in."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.accounts import Accounts, accounts, shared_dir
from tests.plane import TWO_TEAMS, Plane, job_dir


def config_text(acc: Accounts, vision: str = "", nlp: str = "") -> str:
    """tests/fixtures/two_teams.yaml with each team's Unix group (and `vision`/`nlp`: more lines of
    each team, e.g. "    pids_max: 256\n") and the token users mapped to the accounts."""
    text = TWO_TEAMS.read_text()
    text = text.replace("  - name: vision\n", f"  - name: vision\n    group: {acc.group('vis')}\n{vision}")
    text = text.replace("  - name: nlp\n", f"  - name: nlp\n    group: {acc.group('nlp')}\n{nlp}")
    return text + f"users:\n  alice: {acc.user('alice')}\n  bob: {acc.user('bob')}\n"


@contextmanager
def two_accounts() -> Iterator[Accounts]:
    """alice (group vis, team vision) and bob (group nlp, team nlp), removed after."""
    with accounts({"alice": ["vis"], "bob": ["nlp"]}, ["vis", "nlp"]) as acc:
        yield acc


@contextmanager
def root_plane(acc: Accounts, prefix: str, text: str | None = None, **plane_kw: Any) -> Iterator[Plane]:
    """A root plane that runs jobs as their owners (no run_as, no allow_root_jobs), on a data dir
    every account may pass through, with `text` (default `config_text(acc)`) as its configuration."""
    with shared_dir(prefix) as d:
        cfg = d / "cluster.yaml"
        cfg.write_text(text if text is not None else config_text(acc))
        p = Plane(d / "yard", config=cfg, run_as=None, allow_root_jobs=None, **plane_kw)
        try:
            yield p
        finally:
            p.stop()


@dataclass
class Yard:
    """The plane, the accounts, and where each member may work (`home(role)`: theirs, 0755)."""

    plane: Plane
    acc: Accounts
    base: Path

    def home(self, role: str) -> Path:
        d = self.base / f"home-{role}"
        if not d.exists():
            d.mkdir()
            team = {"alice": "vis", "bob": "nlp"}[role]
            os.chown(d, self.acc.uid(role), self.acc.gid(team))
        return d

    def submit(self, role: str, command: list[str], **body: Any) -> int:
        team = {"alice": "vision", "bob": "nlp"}[role]
        client = self.plane.as_user(role, "member", team)
        r = client.post("/api/v1/jobs", json={"command": command, "team": team, **body})
        assert r.status_code == 201, r.text
        return int(r.json()["id"])

    def job_dir(self, job_id: int) -> Path:
        return job_dir(self.plane.cp.data_dir, job_id)

    def log(self, job_id: int, rank: int = 0) -> str:
        try:
            return (self.job_dir(job_id) / "logs" / f"rank-{rank}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def ended(self, job_id: int, timeout: float = 120.0) -> dict[str, Any]:
        return self.plane.wait(job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"),
                               timeout=timeout)


@contextmanager
def yard(prefix: str, **plane_kw: Any) -> Iterator[Yard]:
    """Accounts, a shared base directory and a root plane that runs jobs as their owners."""
    with two_accounts() as acc, shared_dir(prefix) as base:
        os.chmod(base, 0o755)
        cfg = base / "cluster.yaml"
        cfg.write_text(config_text(acc))
        p = Plane(base / "yard", config=cfg, run_as=None, allow_root_jobs=None, **plane_kw)
        try:
            yield Yard(p, acc, base)
        finally:
            p.stop()
