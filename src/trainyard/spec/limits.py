"""The `limits:` section of the cluster configuration: what one user or team may submit.

Slurm's association limits, by the names its admins know (sacctmgr's, in snake case), set as
defaults for everyone and overridden per team and per user:

    limits:
      default:                  # every user of every team
        max_submit_jobs: 1000   # MaxSubmitJobs: a user's jobs pending or running (array tasks count one each)
        max_array_size: 1001    # MaxArraySize: every task index below it (so at most that many tasks)
        max_script_size: 1M     # SchedulerParameters=max_script_size: bytes of a batch script
        max_command_size: 128K  # bytes of a job's command (argv, with a NUL after each word)
        max_env_vars: 1000      # variables of a job's environment
        max_env_size: 128K      # bytes of it (KEY=VALUE and a NUL, for each)
        grp_submit_jobs: 20000  # GrpSubmitJobs: a team's jobs pending or running, all its users together
      teams:
        vision: {max_submit_jobs: 200, grp_submit_jobs: 1000}
      users:
        alice: {max_submit_jobs: 20}

As in Slurm's hierarchy, a user's entry wins over the team's, the team's over `default`, and
`default` over the built-in values below (`BUILTIN`). `max_submit_jobs` set on a team is each
of its users' limit (Slurm's MaxSubmitJobs on an account), `grp_submit_jobs` the team's total (so
it is not a user's to have). A size takes bytes or a number with K, M or G (powers of 1024).
Every value is bounded (`CEILINGS`): a typo cannot make a limit the plane cannot hold.

The checks themselves are `services/limits.py`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

SIZE_FIELDS = ("max_script_size", "max_command_size", "max_env_size")
COUNT_FIELDS = ("max_submit_jobs", "grp_submit_jobs", "max_array_size", "max_env_vars")

# What applies where nothing is configured: generous for real jobs, tight enough that one
# submission cannot write a gigabyte (a 1,000-task array with a 1 MB environment once did).
BUILTIN: dict[str, int | None] = {
    "max_submit_jobs": 10_000,  # per user; Slurm's MaxJobCount (for the whole cluster) is 10,000 by default
    "grp_submit_jobs": None,
    "max_array_size": None,  # unset: up to 1,000 tasks, indices up to 1,000,000 (services/arrays.py)
    "max_script_size": 1 << 20,
    "max_command_size": 128 << 10,  # Linux's MAX_ARG_STRLEN: one argument longer cannot be executed
    "max_env_vars": 1_000,
    "max_env_size": 128 << 10,
}
# The most any value may be set to (what the API takes at all, or the kernel can execute).
CEILINGS: dict[str, int] = {
    "max_submit_jobs": 1_000_000, "grp_submit_jobs": 10_000_000, "max_array_size": 1_000_001,
    "max_script_size": 4 << 20, "max_command_size": 2 << 20, "max_env_vars": 100_000, "max_env_size": 2 << 20,
}
_SIZE = re.compile(r"(\d+)\s*([kmg]?)(?:i?b)?", re.I)
_UNIT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(value: Any) -> Any:
    """Bytes from an integer or `64K`, `1M`, `4MiB` (powers of 1024); anything else is left to
    pydantic's own error."""
    if isinstance(value, str):
        m = _SIZE.fullmatch(value.strip())
        if m is None:
            raise ValueError(f"cannot read {value!r} as a size: bytes, or a number with K, M or G (e.g. 64K, 1M)")
        return int(m.group(1)) * _UNIT[m.group(2).lower()]
    return value


def _bounds(name: str, size: bool = False) -> Any:
    """A field's bounds: at most its ceiling, and an array at least one task. A size is first read
    by `parse_size`, so it is not held to a strict int."""
    return Field(strict=not size, ge=1 if name == "max_array_size" else 0, le=CEILINGS[name])


# One alias per field, written out so that a type checker reads each as `int | None`.
_Jobs = Annotated[int | None, _bounds("max_submit_jobs")]
_GrpJobs = Annotated[int | None, _bounds("grp_submit_jobs")]
_ArraySize = Annotated[int | None, _bounds("max_array_size")]
_EnvVars = Annotated[int | None, _bounds("max_env_vars")]
_ScriptSize = Annotated[int | None, _bounds("max_script_size", size=True), BeforeValidator(parse_size)]
_CommandSize = Annotated[int | None, _bounds("max_command_size", size=True), BeforeValidator(parse_size)]
_EnvSize = Annotated[int | None, _bounds("max_env_size", size=True), BeforeValidator(parse_size)]


class LimitSet(BaseModel):
    """One entry (`default`, a team's or a user's); None: not set here, the next level applies."""

    model_config = ConfigDict(extra="forbid")

    max_submit_jobs: _Jobs = None
    grp_submit_jobs: _GrpJobs = None
    max_array_size: _ArraySize = None
    max_script_size: _ScriptSize = None
    max_command_size: _CommandSize = None
    max_env_vars: _EnvVars = None
    max_env_size: _EnvSize = None


def _empty(v: Any) -> Any:
    return {} if v is None else v  # a key with every line under it commented out


class LimitsSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    default: Annotated[LimitSet, BeforeValidator(_empty)] = Field(default_factory=LimitSet)
    teams: Annotated[dict[str, LimitSet], BeforeValidator(_empty)] = Field(default_factory=dict, max_length=10_000)
    users: Annotated[dict[str, LimitSet], BeforeValidator(_empty)] = Field(default_factory=dict, max_length=100_000)

    @model_validator(mode="after")
    def _team_totals_are_teams(self) -> "LimitsSpec":
        for user, entry in self.users.items():
            if entry.grp_submit_jobs is not None:
                raise ValueError(f"users.{user}.grp_submit_jobs: a team's total (Slurm's GrpSubmitJobs); set it "
                                 "under limits.teams or limits.default")
        return self

    def effective(self, user: str, team: str) -> dict[str, tuple[int | None, str]]:
        """Each limit for `user` submitting for `team`: (value or None for none, where it was set:
        `limits.users.alice`, `limits.teams.vision`, `limits.default` or `built-in`)."""
        levels = [(self.users.get(user), f"limits.users.{user}"), (self.teams.get(team), f"limits.teams.{team}"),
                  (self.default, "limits.default")]
        out: dict[str, tuple[int | None, str]] = {}
        for name in COUNT_FIELDS + SIZE_FIELDS:
            chain = levels[1:] if name == "grp_submit_jobs" else levels
            out[name] = next(((getattr(e, name), where) for e, where in chain
                              if e is not None and getattr(e, name) is not None), (BUILTIN[name], "built-in"))
        return out

    def unknown_teams(self, teams: set[str]) -> list[str]:
        return sorted(set(self.teams) - teams)
