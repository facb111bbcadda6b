"""Real, throwaway Unix accounts and groups for the identity tests (`useradd`/`groupadd`, removed after).

Names are `ty` + 5 random letters and a role suffix, unique per run: other suites may run at the
same time and make accounts of their own. Needs root; `ROOT_ONLY` skips with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import secrets
import string
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="making Unix accounts and running jobs as them needs root")


@dataclass
class Accounts:
    """Accounts and groups made for one test module; `user(x)`, `group(x)` by their short role name."""

    prefix: str
    users: dict[str, str] = field(default_factory=dict)
    groups: dict[str, str] = field(default_factory=dict)

    def group(self, role: str) -> str:
        return self.groups[role]

    def user(self, role: str) -> str:
        return self.users[role]

    def uid(self, role: str) -> int:
        return pwd.getpwnam(self.users[role]).pw_uid

    def gid(self, role: str) -> int:
        return grp.getgrnam(self.groups[role]).gr_gid


@contextlib.contextmanager
def accounts(users: dict[str, list[str]], groups: list[str]) -> Iterator[Accounts]:
    """Make `groups`, then `users` ({role: [group roles it is a member of]}); remove them all after."""
    prefix = "ty" + "".join(secrets.choice(string.ascii_lowercase) for _ in range(5))
    made = Accounts(prefix)
    try:
        for g in groups:
            name = f"{prefix}{g}"
            subprocess.run(["groupadd", name], check=True, capture_output=True)
            made.groups[g] = name
        for u, member_of in users.items():
            name = f"{prefix}{u}"
            extra = ["-G", ",".join(made.groups[g] for g in member_of)] if member_of else []
            subprocess.run(["useradd", "-M", "-d", "/nonexistent", "-s", "/bin/sh", *extra, name], check=True,
                           capture_output=True)
            made.users[u] = name
        yield made
    finally:
        for name in made.users.values():
            subprocess.run(["userdel", name], check=False, capture_output=True)
        for name in made.groups.values():
            subprocess.run(["groupdel", name], check=False, capture_output=True)


@contextlib.contextmanager
def shared_dir(prefix: str) -> Iterator[Path]:
    """A fresh directory every account can pass through (pytest's tmp dirs are 0700 root's)."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d.chmod(0o711)
    try:
        yield d
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(d)], check=False)


def python_for_accounts() -> tuple[str, str] | None:
    """(an interpreter other accounts may run, the PYTHONPATH that gives it trainyard and its
    dependencies), or None. This interpreter may live where only root enters (a pyenv under
    /root); a system python3 of the same version can use the same site-packages."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    src = str(Path(__file__).resolve().parents[1] / "src")
    site = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    for exe in (sys.executable, f"/usr/bin/python{here}", "/usr/bin/python3"):
        probe = subprocess.run(["runuser", "-u", "nobody", "--", exe, "-c",
                                "import sys; print(f'{sys.version_info.major}.{sys.version_info.minor}')"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == here:
            path = os.pathsep.join([src, *site])
            ok = subprocess.run(["runuser", "-u", "nobody", "--", "env", f"PYTHONPATH={path}", exe, "-c",
                                 "import trainyard.cli.main"], capture_output=True)
            if ok.returncode == 0:
                return exe, path
    return None
