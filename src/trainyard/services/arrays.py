"""Job arrays, as `sbatch --array` takes them: one submission, many tasks that differ only in
their index (`$SLURM_ARRAY_TASK_ID`), the usual shape of a hyperparameter sweep.

    0-9         ten tasks, 0 to 9          1,3,5      three tasks
    0-15:4      0, 4, 8, 12                0-99%8     a hundred, at most 8 running at once

Each task is a job of its own (its own id, attempts, logs, checkpoints and preemptions); the
first task's id is the array's id (Slurm's ArrayJobId), which `yard cancel/hold/release/requeue`
take for the whole array and `ARRAY_TASK` forms such as `42_3` name one task of. The `%N`
throttle keeps all but N of the array's tasks out of the scheduler's view (reason
`JobArrayTaskLimit`), lowest index first. This module is pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from trainyard.contracts import JobVar, array_env

MAX_TASKS = 1000  # Slurm's default MaxArraySize is 1001 (indices 0..1000)
MAX_INDEX = 1_000_000


@dataclass(frozen=True)
class ArraySpec:
    indices: tuple[int, ...]  # ascending, without repeats
    throttle: int | None = None  # at most this many tasks running at once
    # SLURM_ARRAY_TASK_STEP, as Slurm 22.05 sets it: the step of the first `lo-hi:step` range, else 1
    # (`1,3,5` has 1, `0-15:4,20` has 4). What the tasks are told, not which tasks there are.
    step: int = field(default=1, compare=False)


def parse(text: str) -> ArraySpec:
    """`0-9%2` → its indices and throttle. Raises ValueError naming what is wrong."""
    s = text.strip()
    throttle = None
    first_step = None
    if "%" in s:
        s, _, t = s.partition("%")
        if not (t.isascii() and t.isdigit()) or int(t) < 1:
            raise ValueError(f"the throttle after '%' must be a whole number from 1, not {t!r}")
        throttle = int(t)
    if not s:
        raise ValueError("an empty array; e.g. 0-9, 1,3,5, 0-15:4 or 0-99%8")
    out: set[int] = set()
    for part in s.split(","):
        m = re.fullmatch(r"(\d{1,7})(?:-(\d{1,7})(?::(\d{1,7}))?)?", part.strip())
        if not m:
            raise ValueError(f"cannot read {part.strip()!r} of {text.strip()!r}; e.g. 0-9, 1,3,5, 0-15:4 or 0-99%8")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        step = int(m.group(3)) if m.group(3) is not None else 1
        if m.group(3) is not None and first_step is None:
            first_step = step
        if hi < lo or step < 1:
            raise ValueError(f"{part.strip()!r}: a range goes up, by a step of at least 1")
        if hi > MAX_INDEX:
            raise ValueError(f"{part.strip()!r}: indices go up to {MAX_INDEX}")
        if (hi - lo) // step + 1 + len(out) > MAX_TASKS:
            raise ValueError(f"at most {MAX_TASKS} tasks in an array")
        out.update(range(lo, hi + 1, step))
    if len(out) > MAX_TASKS:
        raise ValueError(f"at most {MAX_TASKS} tasks in an array")
    return ArraySpec(tuple(sorted(out)), throttle, first_step or 1)


def normalize(spec: ArraySpec) -> str:
    """The stored form: runs of consecutive indices as `lo-hi`, and the throttle."""
    runs: list[str] = []
    idx = spec.indices
    i = 0
    while i < len(idx):
        j = i
        while j + 1 < len(idx) and idx[j + 1] == idx[j] + 1:
            j += 1
        runs.append(str(idx[i]) if i == j else f"{idx[i]}-{idx[j]}")
        i = j + 1
    return ",".join(runs) + (f"%{spec.throttle}" if spec.throttle else "")


def task_env(array_id: int, index: int, spec: ArraySpec) -> dict[str, str]:
    """What each task's ranks see, under Slurm's names (`contracts.array_env`: scripts read
    `$SLURM_ARRAY_TASK_ID`) and ours. Stored with the task's environment at submission, so every
    backend passes them on unchanged."""
    return {**array_env(array_id, index, spec.indices, spec.step),
            JobVar.ARRAY_JOB_ID: str(array_id), JobVar.ARRAY_TASK_ID: str(index)}


def throttled(pending: list[tuple[int, int, int, int]], active: dict[int, int]) -> set[int]:
    """The waiting tasks a `%N` throttle keeps back this pass.

    `pending`: (job id, array id, task index, throttle) of waiting tasks of throttled arrays;
    `active`: running tasks per array id. Each array lets in its lowest-index waiting tasks up to
    its throttle less its running ones."""
    by_array: dict[int, list[tuple[int, int, int]]] = {}
    for jid, aid, index, limit in pending:
        by_array.setdefault(aid, []).append((index, jid, limit))
    out: set[int] = set()
    for aid, tasks in by_array.items():
        tasks.sort()
        room = max(0, tasks[0][2] - active.get(aid, 0))
        out.update(jid for _, jid, _ in tasks[room:])
    return out
