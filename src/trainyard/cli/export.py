"""`--export`: which of the submitting shell's environment goes with the job, as sbatch has it.

sbatch's default is `--export=ALL`: the job sees the shell it was submitted from, so a script that
calls `torchrun` from an activated virtualenv finds it on PATH. Forms (Slurm's):

    ALL                   the shell's environment (the default)
    NONE                  nothing of the shell; only what trainyard sets (the job's SLURM_*, TRAINYARD_*,
                          torchelastic's variables, HOME/USER/LOGNAME of the owner, a default PATH),
                          nothing of the control plane's own environment either (as Slurm's NONE,
                          which starts from the user's login environment)
    VAR1,VAR2             only these of the shell (a name the shell lacks is left out, as sbatch does)
    ALL,VAR=val           the shell's environment with VAR set to val (ALL may stand anywhere in the list)
    VAR1,VAR=val          VAR1 from the shell, VAR set

With NONE or a list (no ALL), `yard submit` sets SLURM_EXPORT_ENV to the option's value, as sbatch
does. Whatever the form, the backends lay what was exported over a login-like base (a default PATH,
the account's HOME/USER/LOGNAME/SHELL: backends/local/login_env.py), never over the plane's own
environment: with ALL the submitter's PATH is the job's, with NONE the default one.

What of the shell is never sent, whatever the form (`shell_env`):
- `YARD_*` and `TRAINYARD_*`: the CLI's own settings, YARD_TOKEN among them (a job must not carry its
  submitter's token; it gets a job-scoped one), and the plane's, which the plane sets itself and
  which win over anything in the job's env (control/loop/attempt_start.py, contracts.rank_env).
- `SLURM_*`/`SLURMD_*`: those of a shell inside some other allocation describe that allocation; the
  job's own are set by the backend.
- `PWD`, `OLDPWD`, `SHLVL`, `_`: the shell's bookkeeping; the job has its own working directory.
Trimming these keeps the env within the operator's max_env_vars/max_env_size more often; a shell
still over them is refused by the server with the limit's own message (services/limits.py), which
the user answers with `--export=NONE` or a list.

Who the job runs as never comes from the env: the plane resolves the owner from the submitter's
identity (services/owners.py), and the backend sets HOME/USER/LOGNAME over the env. LD_PRELOAD and
the like are sent like any variable: the job runs as its owner, so they are the owner's business.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

NEVER_PREFIXES = ("YARD_", "TRAINYARD_", "SLURM_", "SLURMD_")
NEVER_NAMES = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ExportError(ValueError):
    """A malformed `--export` value; the message names the option."""


@dataclass(frozen=True)
class Export:
    everything: bool = True  # ALL: the whole (filtered) shell
    names: tuple[str, ...] = ()  # taken from the shell by name
    values: dict[str, str] = field(default_factory=dict)  # VAR=val given in the option


def parse_export(raw: str, option: str = "--export") -> Export:
    """`raw` in sbatch's `--export` syntax (see the module docstring).

    Raises:
        ExportError: empty, an empty item, NONE with anything else, or a bad variable name.
    """
    items = [x.strip() for x in raw.split(",")]
    if not raw.strip() or any(not x for x in items):
        raise ExportError(f"{option}: expected ALL, NONE or a comma-separated list VAR[=value],…; got {raw!r}")
    upper = [x.upper() for x in items]
    if "NONE" in upper:
        if len(items) > 1:
            raise ExportError(f"{option}: NONE stands alone (NONE exports nothing of your shell); got {raw!r}")
        return Export(everything=False)
    names: list[str] = []
    values: dict[str, str] = {}
    for item, up in zip(items, upper):
        if up == "ALL":
            continue
        name, eq, value = item.partition("=")
        if not _NAME.fullmatch(name):
            raise ExportError(f"{option}: {name!r} is not a variable name (letters, digits and _); got {raw!r}")
        if eq:
            values[name] = value
        else:
            names.append(name)
    return Export(everything="ALL" in upper, names=tuple(names), values=values)


def shell_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The shell's environment less what is never sent (module docstring)."""
    return {k: v for k, v in environ.items() if k not in NEVER_NAMES and not k.startswith(NEVER_PREFIXES)}


def job_env(export: Export, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment to submit with the job: the shell's part that `export` selects, then its values."""
    shell = shell_env(environ)
    out = dict(shell) if export.everything else {k: shell[k] for k in export.names if k in shell}
    out.update(export.values)
    return out
