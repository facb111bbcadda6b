"""sbatch options trainyard accepts and records without acting on them (issue 35 point 4).

Site templates carry CPU-binding and accounting options (`--hint=nomultithread`,
`--distribution=block`, `--gres-flags`, `--tmp`, `--get-user-env`, `--threads-per-core`,
`--wckey`) that change nothing trainyard decides: its ranks are placed per GPU, and their CPUs
are the cgroup's. Refusing them would reject a whole published script for a habit; dropping them
silently would lose what the user asked. So each is checked (a malformed value is an error naming
the line, as sbatch would refuse it), then recorded in the job's environment under the variable
Slurm itself sets or reads for it (an in-job `srun` sees it as under Slurm, and `yard show` lists
them as `scontrol show job` does).
"""

from __future__ import annotations

import re
from typing import Callable

from trainyard.spec.parsing import parse_mem_mib

_HINTS = ("compute_bound", "memory_bound", "multithread", "nomultithread")
_DIST = re.compile(r"(\*|block|cyclic|arbitrary|plane=\d+)(:(\*|block|cyclic|fcyclic)){0,2}(,(pack|nopack))?",
                   re.IGNORECASE)
_GRES_FLAGS = ("enforce-binding", "disable-binding", "one-task-per-sharing", "multiple-tasks-per-sharing")
_WCKEY = re.compile(r"\*?[A-Za-z0-9_.+-]{1,64}")
# A job's environment variable for each: sbatch's output variable, or srun's input one (an in-job
# srun inherits it), or, for --tmp, which Slurm keeps only in the job record, trainyard's own.
ENV: dict[str, str] = {
    "--hint": "SLURM_HINT",
    "--distribution": "SLURM_DISTRIBUTION",
    "--gres-flags": "SLURM_GRES_FLAGS",
    "--tmp": "TRAINYARD_MIN_TMP_DISK_MIB",
    "--get-user-env": "SLURM_GET_USER_ENV",
    "--threads-per-core": "SLURM_THREADS_PER_CORE",
    "--wckey": "SLURM_WCKEY",
}
# how `yard show` names each, as `scontrol show job` does
SHOWN: dict[str, str] = {
    "SLURM_HINT": "Hint", "SLURM_DISTRIBUTION": "Distribution", "SLURM_GRES_FLAGS": "GresFlags",
    "TRAINYARD_MIN_TMP_DISK_MIB": "MinTmpDiskNode", "SLURM_GET_USER_ENV": "GetUserEnv",
    "SLURM_THREADS_PER_CORE": "ThreadsPerCore", "SLURM_WCKEY": "WCKey", "SLURM_GPUS_PER_TASK": "GpusPerTask",
    "SLURM_MEM_PER_CPU": "MinMemoryCPU",
}
SHORT = {"-m": "--distribution"}
OPTIONAL_VALUE = ("--get-user-env",)  # sbatch's --get-user-env[=timeout][mode]


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    def check(v: str) -> str:
        words = [w.strip().lower() for w in v.split(",")]
        bad = [w for w in words if w not in choices]
        if bad or not words:
            raise ValueError(f"expected {' or '.join(choices)}, got {v!r}")
        return ",".join(words)
    return check


def _dist(v: str) -> str:
    if not _DIST.fullmatch(v.strip()):
        raise ValueError(f"expected block, cyclic, arbitrary or plane=N (then :block|cyclic|fcyclic, ,Pack), got {v!r}")
    return v.strip()


def _tmp(v: str) -> str:
    return str(parse_mem_mib(v))


def _count(v: str) -> str:
    if not v.strip().isdigit() or int(v) < 1:
        raise ValueError(f"expected a whole number of at least 1, got {v!r}")
    return str(int(v))


def _user_env(v: str) -> str:
    if v and not re.fullmatch(r"\d*[LS]?", v.strip()):
        raise ValueError(f"expected [timeout][L|S], got {v!r}")
    return "1"  # as sbatch sets it


def _wckey(v: str) -> str:
    if not _WCKEY.fullmatch(v.strip()):
        raise ValueError(f"expected a name (letters, digits, _.+-), got {v!r}")
    return v.strip()


_CHECK: dict[str, Callable[[str], str]] = {
    "--hint": _one_of(_HINTS), "--distribution": _dist, "--gres-flags": _one_of(_GRES_FLAGS), "--tmp": _tmp,
    "--get-user-env": _user_env, "--threads-per-core": _count, "--wckey": _wckey,
}


def record(option: str, value: str) -> tuple[str, str]:
    """(environment variable, value) that records `option` (a long name of ENV) given `value`.

    Raises:
        ValueError: a value sbatch would refuse (the message names the option).
    """
    try:
        return ENV[option], _CHECK[option](value)
    except ValueError as e:
        raise ValueError(f"{option}: {e}") from None


def shown(env: dict[str, str] | None) -> str:
    """The recorded options of a job's environment, as scontrol's `Key=value` words."""
    return " ".join(f"{SHOWN[k]}={env[k]}" + ("M" if k in ("TRAINYARD_MIN_TMP_DISK_MIB", "SLURM_MEM_PER_CPU") else "")
                    for k in SHOWN if env and env.get(k))
