"""Who a job runs as: a token's user becomes a Unix account, a team a Unix group (design rule 6).

A token names a user (`alice`) and a team; the operating system knows accounts and groups. The
mapping is the cluster configuration's (`spec.models.ConfigSpec`):

    token user U  →  users[U] when the configuration maps it (`users: {alice: asmith}`)
                  →  else the account named U, when there is one
                  →  else `run_as`, when the configuration sets it
                  →  else refused: a 403 at submit that names U, and nothing is stored
    team T        →  its `group:` when set (the group must exist; the account must be a member)
                  →  else the group named T, when there is one and the account is a member
                  →  else none: the job's files get the account's own primary group

The account must not be root (uid 0) unless the configuration says `allow_root_jobs: true`.
The ranks get the account's uid, its primary gid and its groups as the operating system lists
them (`os.getgrouplist`, as login and slurmd do): trainyard never hands out a group the system
does not give the account, so a job has the same rights under the local backend as under Slurm.

Only root can start a process as someone else. A plane started as a plain user runs every job
as itself: token users without an account of their own run as the plane's account (`run_as`
defaults to it), a token user who is some other account, or maps to one, is refused. `notes`
says so, and `yard up` prints it.

`check_config` is what applying a configuration adds to its validation: a `users:` entry, a
`run_as` or a team `group:` that names nothing on this machine is an error naming the entry,
never a silent fallback. `resolve` is called at submit (is there someone to run this as?) and at
launch (the same question again: accounts come and go; the answer is the `Owner` the backend
starts the ranks as).
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass

from trainyard.backends.base import Owner
from trainyard.spec.parsing import ConfigError
from trainyard.services.errors import Forbidden
from trainyard.spec.models import ConfigSpec


@dataclass(frozen=True)
class Identity:
    """What one job runs as: `owner` (uid, gid, groups) and the group its files belong to (the
    team's, or the account's own primary group when the team has none it can use)."""

    owner: Owner
    group: int  # gid of the job directory's group
    team_group: str | None  # the team's Unix group name, when it has one the account is in

    @property
    def launch_owner(self) -> Owner | None:
        """`LaunchSpec.owner`: None when the job runs as the plane itself (nothing to switch)."""
        return None if self.owner.uid == os.geteuid() else self.owner


def plane_is_root() -> bool:
    return os.geteuid() == 0


def plane_account() -> str:
    """The plane's own account name (its uid's, or `uid <n>` for a uid without one)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def _account(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def _group(name: str) -> grp.struct_group | None:
    try:
        return grp.getgrnam(name)
    except KeyError:
        return None


def account_of(spec: ConfigSpec, user: str) -> pwd.struct_passwd:
    """The Unix account token user `user` runs as (see the module docstring).

    Raises:
        Forbidden: none (no mapping, no such account, no `run_as`), root without
            allow_root_jobs, or another account than the plane's on a plane that is not root.
    """
    mapped = spec.users.get(user)
    run_as = spec.run_as or (None if plane_is_root() else plane_account())
    name = mapped or (user if _account(user) is not None else run_as)
    if name is None:
        raise Forbidden(f"user {user!r} has no Unix account on this machine, and the cluster configuration "
                        f"neither maps it (users: {{{user}: <account>}}) nor sets run_as: a job runs as its "
                        f"owner's account", field="user")
    pw = _account(name)
    if pw is None:
        how = f"users: maps {user!r} to" if mapped else "run_as names" if name == spec.run_as else "the account"
        raise Forbidden(f"user {user!r}: {how} {name!r}, which is not an account on this machine", field="user")
    if not plane_is_root() and pw.pw_uid != os.geteuid():
        raise Forbidden(f"this control plane runs as {plane_account()!r}, not root, so it runs only its own "
                        f"jobs; user {user!r} is the account {name!r} (start the plane as root to run jobs as "
                        f"their owners)", field="user")
    if pw.pw_uid == 0 and not spec.allow_root_jobs:
        raise Forbidden(f"user {user!r} runs as root ({name!r}); jobs never run as root unless the cluster "
                        f"configuration says allow_root_jobs: true", field="user")
    return pw


def resolve(spec: ConfigSpec, user: str, team: str) -> Identity:
    """The identity a job of token user `user` and team `team` runs with.

    Raises:
        Forbidden: see `account_of`; or the team's configured group does not exist or the account
            is not one of its members.
    """
    pw = account_of(spec, user)
    groups = tuple(sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid))))
    owner = Owner(pw.pw_name, pw.pw_uid, pw.pw_gid, groups)
    t = next((x for x in spec.teams if x.name == team), None)
    wanted = (t.group if t is not None else None)
    if wanted is not None:
        g = _group(wanted)
        if g is None:
            raise Forbidden(f"team {team!r}: its Unix group {wanted!r} does not exist on this machine", field="team")
        if g.gr_gid not in groups:
            raise Forbidden(f"user {user!r} (account {pw.pw_name!r}) is not a member of Unix group {wanted!r}, "
                            f"team {team!r}'s group (add it: usermod -aG {wanted} {pw.pw_name})", field="team")
        return Identity(owner, g.gr_gid, wanted)
    g = _group(team)
    if g is not None and g.gr_gid in groups:
        return Identity(owner, g.gr_gid, team)
    return Identity(owner, pw.pw_gid, None)


def check_config(spec: ConfigSpec) -> None:
    """What applying `spec` on this machine needs beyond its own validation: every account and
    group it names exists, nothing maps to root without allow_root_jobs, and a plane that is not
    root is not told to run jobs as someone else.

    Raises:
        ConfigError: naming the entry (`users.alice`, `run_as`, `teams.0.group`).
    """
    me = os.geteuid()
    for field, name in [*((f"users.{u}", a) for u, a in spec.users.items()),
                        *((("run_as", spec.run_as),) if spec.run_as else ())]:
        pw = _account(name)
        if pw is None:
            raise ConfigError(f"{name!r} is not a Unix account on this machine", field=field)
        if pw.pw_uid == 0 and not spec.allow_root_jobs:
            raise ConfigError(f"{name!r} is root; jobs never run as root unless allow_root_jobs: true", field=field)
        if me != 0 and pw.pw_uid != me:
            raise ConfigError(f"{name!r} is not this control plane's account ({plane_account()!r}), and a plane "
                              f"that is not root can run jobs only as itself", field=field)
    for i, t in enumerate(spec.teams):
        if t.group is not None and _group(t.group) is None:
            raise ConfigError(f"team {t.name!r}: {t.group!r} is not a Unix group on this machine",
                              field=f"teams.{i}.group")


def notes(spec: ConfigSpec) -> list[str]:
    """What `yard up` says about identity at start: who jobs run as, and what this plane cannot do."""
    if not plane_is_root():
        me = plane_account()
        return [f"this control plane runs as {me!r}, not root: every job runs as {me} and can read what {me} "
                f"can (this data dir included); a token user with another Unix account is refused. Start it "
                f"as root to run each job as its owner."]
    out = ["jobs run as their owners' Unix accounts (token user = account"
           + (f", {len(spec.users)} mapped in users:" if spec.users else "") + ")"
           + (f"; token users without an account run as {spec.run_as!r}" if spec.run_as else
              "; a token user without an account is refused at submit")]
    if spec.allow_root_jobs:
        out.append("allow_root_jobs: true: jobs may run as root and read everything, the store included")
    return out


def blocked_at(path: str | os.PathLike[str], owner: Owner) -> str | None:
    """The first directory on the way to (and including) `path` that `owner` may not enter (no
    search permission for its uid or groups), or None when it can reach `path`. Checked from the
    modes (root passes everything), so a plane running as root can ask on the account's behalf."""
    if owner.uid == 0:
        return None
    p = os.path.abspath(path)
    parts = [p]
    while (parent := os.path.dirname(parts[-1])) != parts[-1]:
        parts.append(parent)
    groups = set(owner.groups) | {owner.gid}
    for d in reversed(parts):
        try:
            st = os.stat(d)  # plane's own: the way to its data dir (job dirs are below)
        except OSError:
            return d
        if st.st_uid == owner.uid:
            ok = st.st_mode & 0o100
        elif st.st_gid in groups:
            ok = st.st_mode & 0o010
        else:
            ok = st.st_mode & 0o001
        if not ok:
            return d
    return None
