"""What the commands share: one-line errors with exit code 2, argument parsing, workload loading.

Every problem with the arguments or the input (bad cluster shape, unknown policy, bad date or
duration, missing trace, malformed trace row) is reported as one line on stderr, `error: …`,
naming the file, line and field when there is one, and the command exits with code 2 before
writing anything.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import typer

from trainyard.spec.parsing import ConfigError, parse_duration

FORMATS = ("philly", "synthetic", "pollux")
# The cluster each format runs on when --cluster is not given (Pollux: its simulator's 16 x 4).
DEFAULT_CLUSTERS = {"philly": "80x8", "synthetic": "80x8", "pollux": "16x4"}
EXIT_BAD_INPUT = 2


class BadInput(Exception):
    """An argument or input file the command cannot use; becomes `error: …` and exit code 2."""


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def describe(e: ConfigError) -> str:
    """A ConfigError as one line; errors about an argument (no file) name the option."""
    if e.file is None and e.field:
        return f"--{e.field.replace('_', '-')}: {e.message}"
    return str(e)


def run_guarded(fn, *args, **kwargs):
    """Call fn, turning ConfigError/BadInput into a one-line error and exit code 2."""
    try:
        return fn(*args, **kwargs)
    except ConfigError as e:
        fail(describe(e))
    except BadInput as e:
        fail(str(e))


def parse_seconds(value: str | None, option: str) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as e:
        raise BadInput(f"{option}: {e}") from None


def resolve_policies(spec: str, option: str = "--policies") -> list[str]:
    """`all` or a comma-separated list → policy names, checked against the registry."""
    from trainyard.sched.policy import policy_names

    try:
        known = policy_names()
    except ImportError as e:  # the engine or baselines are not importable
        raise BadInput(f"cannot load the scheduling policies: {e}") from None
    if spec.strip() == "all":
        return list(known)
    names = [p.strip() for p in spec.split(",") if p.strip()]
    if not names:
        raise BadInput(f"{option}: give 'all' or a comma-separated list of policies")
    for p in names:
        if p not in known:
            raise BadInput(f"{option}: unknown policy {p!r}; known: {', '.join(known)}")
    if len(set(names)) != len(names):
        raise BadInput(f"{option}: a policy is named twice")
    return names


def check_choice(value: str, choices: tuple[str, ...], option: str) -> str:
    if value not in choices:
        raise BadInput(f"{option}: {value!r} is not one of {', '.join(choices)}")
    return value


def trace_file(trace: Path) -> Path:
    """--trace as given: a file, or the name of a fetched public trace (`philly`, `pollux:3`;
    `sim/trace_catalog.py`), found in the data dir that `yard trace fetch` filled."""
    if trace.is_file():
        return trace
    from trainyard.defaults import default_data_dir
    from trainyard.sim.trace_catalog import resolve

    try:
        found = resolve(str(trace), default_data_dir())
    except FileNotFoundError as e:
        raise BadInput(f"--trace: {e}") from None
    if found is None:
        raise BadInput(f"--trace: no such file: {trace} (nor a trace name: philly, pollux, pollux:N)")
    return found


def load_workload(fmt: str, trace: Path | None, *, date_from: str | None, date_to: str | None,
                  warmup_days: float, cluster: str | None, seed: int, jobs: int, teams: int = 3):
    """Load (philly, pollux) or generate (synthetic) the workload; every input problem raises
    ConfigError/BadInput. `cluster` None: the format's default (`DEFAULT_CLUSTERS`)."""
    from trainyard.sim.philly import load_philly, parse_cluster_shape

    check_choice(fmt, FORMATS, "--format")
    cluster = cluster or DEFAULT_CLUSTERS[fmt]
    parse_cluster_shape(cluster)
    if fmt == "pollux":
        from trainyard.sim.pollux import load_pollux

        if trace is None:
            raise BadInput("--trace: required with --format pollux (a workload-N.csv of Pollux's, or pollux:N)")
        return load_pollux(trace_file(trace), cluster=cluster)
    if fmt == "philly":
        if trace is None:
            raise BadInput("--trace: required with --format philly (a CSV file, or philly)")
        return load_philly(trace_file(trace), date_from=date_from, date_to=date_to, warmup_days=warmup_days,
                           cluster=cluster, seed=seed)
    from trainyard.sim.synthetic import generate

    return generate(jobs=jobs, cluster=cluster, seed=seed, teams=teams)


def command_line() -> str:
    return " ".join(["yard", *sys.argv[1:]])
