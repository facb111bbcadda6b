"""Job dependencies, as `sbatch --dependency` takes them: a job waits until other jobs have
started, ended, ended well or ended badly, or until no earlier job of its name and user is left.

    afterok:12:13,singleton    start after jobs 12 and 13 COMPLETED, and no earlier
                               job named like this one of this user is still waiting or running

Kinds (Slurm's meaning): `after` (each job has started, or ended without starting), `afterany`
(each has ended, however), `afterok` (each COMPLETED), `afternotok` (each ended otherwise:
FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED), `singleton`. Parts joined by
`,` must all hold; Slurm's `?` (any one of) is refused, as are its other kinds (`aftercorr`,
`afterburstbuffer`, `+time` delays), with a message that says so.

A dependency that can never hold any more (afterok on a job that failed) is refused at
submission, as Slurm refuses it; one that becomes so while the job waits cancels the job with
the reason `DependencyNeverSatisfied` (Slurm's `kill_invalid_depend`): a pipeline whose first
stage failed does not leave its later stages waiting forever, and each cancelled stage cancels
its own dependents in turn. This module is pure: the caller reads the jobs' states.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trainyard.states import TERMINAL_STATES as TERMINAL
from trainyard.states import JobState

KINDS = ("after", "afterany", "afterok", "afternotok", "singleton")
MAX_JOBS = 1000  # job ids in one dependency


@dataclass(frozen=True)
class Dependency:
    kind: str  # one of KINDS
    job_ids: tuple[int, ...] = ()  # empty for singleton


@dataclass(frozen=True)
class Target:
    """What a dependency reads of a job it names."""
    state: str
    started: bool  # some attempt of it has started


Verdict = tuple[Literal["met", "wait", "never"], str]  # and why, for the event or the error


def parse(text: str) -> list[Dependency]:
    """`afterok:12:13,singleton` → its parts. Raises ValueError naming what is wrong."""
    text = text.strip()
    if not text:
        raise ValueError("an empty dependency; e.g. afterok:12 or afterany:12:13,singleton")
    if "?" in text:
        raise ValueError("'?' (any one of) is not supported; join parts with ',' (all of)")
    out: list[Dependency] = []
    count = 0
    for part in text.split(","):
        kind, _, rest = part.strip().partition(":")
        kind = kind.lower()
        if kind not in KINDS:
            raise ValueError(f"unknown dependency kind {kind!r} in {part.strip()!r}; kinds are {', '.join(KINDS)}")
        if kind == "singleton":
            if rest:
                raise ValueError("singleton takes no job ids")
            out.append(Dependency("singleton"))
            continue
        ids = rest.split(":") if rest else []
        if not ids:
            raise ValueError(f"{kind} needs job ids, e.g. {kind}:12 or {kind}:12:13")
        for x in ids:
            if "+" in x:
                raise ValueError(f"'{kind}:{x}': delays (+minutes) are not supported")
            if not (x.isascii() and x.isdigit()) or len(x) > 18 or int(x) < 1:
                raise ValueError(f"{x!r} in {part.strip()!r} is not a job id (a whole number from 1)")
        count += len(ids)
        if count > MAX_JOBS:
            raise ValueError(f"at most {MAX_JOBS} job ids in a dependency")
        out.append(Dependency(kind, tuple(dict.fromkeys(int(x) for x in ids))))
    return out


def normalize(deps: list[Dependency]) -> str:
    """The stored and shown form: kinds in lower case, ids as given without repeats."""
    return ",".join(d.kind if d.kind == "singleton" else f"{d.kind}:{':'.join(map(str, d.job_ids))}" for d in deps)


def job_ids(deps: list[Dependency]) -> list[int]:
    return sorted({j for d in deps for j in d.job_ids})


def _one(kind: str, jid: int, t: Target) -> Verdict:
    done = t.state in TERMINAL
    if kind == "after":
        return ("met", "") if t.started or done else ("wait", f"job {jid} has not started")
    if kind == "afterany":
        return ("met", "") if done else ("wait", f"job {jid} has not ended")
    if kind == "afterok":
        if t.state == JobState.COMPLETED:
            return "met", ""
        return ("never", f"afterok:{jid} can never be met: job {jid} is {t.state}") if done else \
            ("wait", f"job {jid} has not completed")
    # afternotok
    if t.state == JobState.COMPLETED:
        return "never", f"afternotok:{jid} can never be met: job {jid} COMPLETED"
    return ("met", "") if done else ("wait", f"job {jid} has not ended")


def verdict(deps: list[Dependency], targets: dict[int, Target], singleton_blocker: int | None) -> Verdict:
    """Whether the job may run now (`met`), must wait (`wait`), or never will (`never`), and why.

    `targets` holds every job the dependency names (a missing one reads as never met: the store
    keeps jobs, so it was never there); `singleton_blocker` is an earlier job of the same name and
    user that has not ended, if any."""
    waiting = ""
    for d in deps:
        if d.kind == "singleton":
            if singleton_blocker is not None and not waiting:
                waiting = f"singleton: job {singleton_blocker} of the same name and user has not ended"
            continue
        for jid in d.job_ids:
            t = targets.get(jid)
            if t is None:
                return "never", f"{d.kind}:{jid} can never be met: there is no job {jid}"
            v, why = _one(d.kind, jid, t)
            if v == "never":
                return v, why
            if v == "wait" and not waiting:
                waiting = why
    return ("wait", waiting) if waiting else ("met", "")
