"""What a rank's environment starts from: an allow-list, never the plane's own environment.

The plane (root) holds secrets in its environment: the store's password (`PGPASSWORD`,
`YARD_DB_URL`), a cloud's credentials (`AWS_*`), an operator's `YARD_TOKEN`. Passing on
"everything but a deny-list" leaks the next secret nobody thought of, so a job gets only what is
named here, as a login of its account would have it (and as Slurm's `--export=NONE`, systemd's
`User=` services):

- `PATH`: a default one (`DEFAULT_PATH`). The submitter's own PATH (a virtualenv's `torchrun`)
  comes with the job's exported environment (`--export=ALL`, the default: cli/export.py), which
  the backend lays over this base;
- `HOME`, `USER`, `LOGNAME`, `SHELL` of the account the ranks run as (as `login` and slurmd set
  them), the plane's own account when the job has no owner;
- of the plane's environment, only `PASSED_ON`: the host's locale and time zone (`LANG`, `TZ`:
  systemd gives its services the system's locale likewise; not `LC_ALL`, which would override the
  submitter's own `LANG`) and `SLURM_CONF` (which Slurm cluster a job's `scontrol` asks). None of
  them is a credential.

Then come, in the backend, the job's own exported variables and trainyard's and Slurm's
(`contracts.rank_env`), which win over the base.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PASSED_ON = ("LANG", "TZ", "SLURM_CONF")


def account_env(uid: int, user: str | None = None) -> dict[str, str]:
    """HOME, USER, LOGNAME and SHELL of the account `uid` (`user`: its name when the password
    database does not know the uid)."""
    try:
        pw = pwd.getpwuid(uid)
        home, name, shell = pw.pw_dir or "/", pw.pw_name, pw.pw_shell or "/bin/sh"
    except KeyError:
        home, name, shell = "/", user or str(uid), "/bin/sh"
    name = user or name
    return {"HOME": home, "USER": name, "LOGNAME": name, "SHELL": shell}


def login_env(uid: int | None = None, user: str | None = None,
              environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The base environment of a rank that runs as `uid` (default: this process's account): a
    default PATH, the account's variables and the plane's `PASSED_ON` (from `environ`, default
    os.environ). Nothing else of `environ`, whatever it holds."""
    environ = os.environ if environ is None else environ
    env = {"PATH": DEFAULT_PATH, **account_env(os.geteuid() if uid is None else uid, user)}
    env.update({k: environ[k] for k in PASSED_ON if k in environ})
    return env
