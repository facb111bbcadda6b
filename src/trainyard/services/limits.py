"""Checking a submission against the operator's limits (`limits:`, `spec/limits.py`).

Called by `jobs.submit` before anything is written; each refusal names the request field, the
limit (its key and where it was set: a user's entry, the team's, `default` or built-in) and the
figures, and stores nothing:

    command, env, script, array       400: the request is larger than the limits allow
    max_submit_jobs, grp_submit_jobs  403 (`LimitExceeded`): the user (the team) already has that
                                      many jobs pending or running; as Slurm's
                                      AssocMaxSubmitJobLimit, and Kubernetes' "exceeded quota"

An array counts as its number of tasks (each task is a job, as in Slurm). The counts are read in
the submission's transaction, under the plane's write lock, so two submissions cannot both take
the last place.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from trainyard.services.errors import ServiceError
from trainyard.spec.limits import LimitsSpec
from trainyard.states import ACTIVE_STATES, PENDING_STATES
from trainyard.store.models import JobRow

LIVE_STATES = tuple(PENDING_STATES) + tuple(ACTIVE_STATES)  # what MaxSubmitJobs counts


class LimitExceeded(ServiceError):
    """A count limit is reached: 403, like a quota (the same request may pass once jobs end)."""

    status = 403


def command_size(command: list[str]) -> int:
    """Bytes of an argv as `execve` takes it: each word and its NUL."""
    return sum(len(a.encode("utf-8", "surrogatepass")) + 1 for a in command)


def env_size(env: dict[str, str]) -> int:
    """Bytes of an environment as `execve` takes it: `KEY=VALUE` and a NUL for each."""
    return sum(len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass")) + 2
               for k, v in env.items())


def check(s: Session, limits: LimitsSpec, *, user: str, team: str, command: list[str], env: dict[str, str],
          script: str | None, indices: tuple[int, ...] | None) -> None:
    """Refuse the submission if it passes any limit of `user` in `team` (see the module docstring).
    `indices`: an array's task indices, None for a single job.

    Raises:
        ServiceError: a size or the array is over its limit (400, the field named).
        LimitExceeded: the user's or the team's jobs pending or running would pass their limit.
    """
    lim = limits.effective(user, team)
    who = f"user {user!r} of team {team!r}"

    def over(field: str, key: str, have: int, unit: str, what: str) -> None:
        limit, where = lim[key]
        if limit is not None and have > limit:
            raise ServiceError(f"{what} is {have} {unit}; {key} allows {who} {limit} ({where})", field=field)

    over("command", "max_command_size", command_size(command), "bytes", "the command")
    over("env", "max_env_vars", len(env), "variables", "the environment")
    over("env", "max_env_size", env_size(env), "bytes", "the environment")
    if script is not None:
        over("script", "max_script_size", len(script.encode("utf-8", "surrogatepass")), "bytes", "the batch script")
    tasks = 1
    if indices:
        tasks = len(indices)
        limit, where = lim["max_array_size"]
        if limit is not None and max(indices) >= limit:
            raise ServiceError(f"task index {max(indices)} is not below max_array_size {limit} for {who} ({where}): "
                               f"indices go from 0 to {limit - 1}", field="array")
    _count(s, lim, "max_submit_jobs", JobRow.user == user, tasks, f"{who} has")
    _count(s, lim, "grp_submit_jobs", JobRow.team == team, tasks, f"team {team!r} has")


def _count(s: Session, lim: dict[str, tuple[int | None, str]], key: str, which: Any, tasks: int, has: str) -> None:
    limit, where = lim[key]
    if limit is None:
        return
    live = s.scalar(select(func.count()).select_from(JobRow).where(which, JobRow.state.in_(LIVE_STATES))) or 0
    if live + tasks > limit:
        adds = f"this submission adds {tasks}" if tasks > 1 else "this one would be one more"
        raise LimitExceeded(f"{has} {live} jobs pending or running and {key} allows {limit} ({where}); {adds}: "
                            "wait for some to end, or cancel some", field=key)
