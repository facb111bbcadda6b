"""`#SBATCH` lines of a batch script → submission fields, as `sbatch` reads them.

As in Slurm, directives are read from the top of the script until the first line that is
neither blank nor a comment; options on the command line win over the script's. Supported:
`-N/--nodes`, `--gres=gpu[:type]:N`, `--gpus-per-node`, `-G/--gpus`, `-t/--time`, `-J/--job-name`,
`-q/--qos` (→ class), `-A/--account` (→ team), `-o/--output` and `-e/--error` (stdout and stderr
apart, Slurm's filename patterns: spec/io_patterns.py), `--open-mode=append|truncate` (whether a new
attempt keeps the earlier attempts' output), `-p/--partition` (→ pool),
`--ntasks-per-node`, `--mem`, `--mem-per-gpu`, `-c/--cpus-per-task`, `-D/--chdir`, `-H/--hold`,
`-d/--dependency`, `-b/--begin`, `-a/--array`, `--export` (cli/export.py), `--signal`
(spec/signals.py), `--mail-type`/`--mail-user` (the cluster's webhook: spec/mail_types.py,
control/lifecycle/notify.py), `--reservation` (an admin reservation,
`cli/reservations.py`: checked at submission, honoured by the engine), `--requeue` (every job's default); placement (services/placement_ask.py):
`-C/--constraint` (features: `&`, `|`, parentheses), the GPU model of `--gpus`/`--gpus-per-node`/
`--gres=gpu:TYPE:N`, `-w/--nodelist` and `-x/--exclude` (hostlists), `--exclusive` (whole nodes),
`-n/--ntasks`, `--gpus-per-task`, `--mem-per-cpu` (services/jobs.py), `--gres=none`; trainyard's
`--dataset=NAME[:VERSION],…` (repeatable, cli/dataset_opts.py: the job's datasets). Refused with
a reason (cli/refused.py): `--nice`, `--time-min`, `--no-requeue`. pyxis's `--container-image`,
`--container-mounts`, `--container-workdir`, `--container-env` and their flags (cli/container_opts.py)
give the job's image (a field `container`, each part's line kept as `container.<part>`). Accepted and
recorded in the job's environment (cli/recorded.py): `--hint`, `-m/--distribution`, `--gres-flags`,
`--tmp`, `--get-user-env`, `--threads-per-core`, `--wckey`. `--comment` is ignored with a warning;
anything else is an error that names the line. Long options may be abbreviated as sbatch allows
(cli/prefixes.py); each field remembers its line, so a refusal by the plane names it too.
In `#SBATCH` lines, as in sbatch, `-e` is `--error` (never yard submit's `--env`).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from trainyard.spec import io_patterns
from trainyard.cli.export import parse_export
from trainyard.spec.mail_types import check_mail_user, parse_mail_type
from trainyard.cli import container_opts, dataset_opts, prefixes, recorded
from trainyard.spec import container_flags
from trainyard.cli.refused import REFUSED, refusal
from trainyard.contracts import expand_hostlist
from trainyard.sched.constraints import parse_features
from trainyard.spec.parsing import parse_begin, parse_duration, parse_mem_mib, parse_node_range
from trainyard.spec.signals import parse_signal


class SbatchError(ValueError):
    def __init__(self, file: str, line: int, message: str):
        super().__init__(f"{file}:{line}: {message}")
        self.file, self.line = file, line


# option spelling → submission field
_FIELDS = {
    "-N": "nodes", "--nodes": "nodes",
    "--gpus-per-node": "gpus_per_node",
    "-G": "gpus", "--gpus": "gpus",
    "-t": "time", "--time": "time",
    "-J": "name", "--job-name": "name",
    "-q": "class", "--qos": "class",
    "-A": "team", "--account": "team",
    "-o": "output", "--output": "output",
    "-p": "pool", "--partition": "pool",
    "--ntasks-per-node": "tasks_per_node", "--tasks-per-node": "tasks_per_node",  # sbatch's alias
    "--mem": "mem", "--mem-per-gpu": "mem_per_gpu",
    "-c": "cpus_per_task", "--cpus-per-task": "cpus_per_task",
    "-D": "workdir", "--chdir": "workdir",
    "--gres": "gres",
    "-d": "dependency", "--dependency": "dependency",
    "-b": "begin", "--begin": "begin",
    "-a": "array", "--array": "array",
    "--export": "export",
    "--signal": "signal",
    "-e": "error", "--error": "error",
    "--open-mode": "open_mode",
    "--mail-type": "mail_type", "--mail-user": "mail_user",
    "-C": "constraint", "--constraint": "constraint",
    "-w": "nodelist", "--nodelist": "nodelist",
    "-x": "exclude", "--exclude": "exclude",
    "-n": "ntasks", "--ntasks": "ntasks",
    "--reservation": "reservation",
    "--mem-per-cpu": "mem_per_cpu",
    "--gpus-per-task": "gpus_per_task",
    "--dataset": "datasets",  # trainyard's (cli/dataset_opts.py): NAME[:VERSION],… ; repeatable
}
_FLAGS = {"-H": "hold", "--hold": "hold", "--exclusive": "exclusive"}
IGNORED = {"--comment"}


UNLIMITED_TIMES = ("unlimited", "infinite")
OPEN_MODES = ("append", "truncate")


def open_mode(raw: str, option: str = "--open-mode") -> str:
    """`--open-mode` as sbatch reads it: `append` or `truncate` (any case; sbatch looks at the first
    letter only, which would take `--open-mode=apple`: refused here).

    Raises:
        ValueError: anything else (the message names `option`).
    """
    v = raw.strip().lower()
    if v not in OPEN_MODES:
        raise ValueError(f"{option}: expected append or truncate, got {raw!r}")
    return v


def slurm_time(raw: str) -> str | None:
    """`--time` as Slurm reads it, for trainyard's durations: a bare number is minutes (a duration
    alone would read it as seconds); `UNLIMITED`, `INFINITE` and `0` are no limit of the job's own
    (None: the class's max run time still holds), as sbatch has them."""
    s = raw.strip()
    if s.lower() in UNLIMITED_TIMES or (s.isdigit() and int(s) == 0):
        return None
    return f"{s}m" if s.isdigit() else raw


def gpu_spec(raw: str, option: str) -> tuple[str | None, int]:
    """A GPU request in Slurm's `[type:]N` form (`--gpus`, `--gpus-per-node`, `--gres=gpu:…`) →
    (model or None, count). The model is a placement constraint the engine honours (nodes'
    `gpu_model` in the cluster configuration); one no node has is refused at submission.

    Raises:
        ValueError: not `N` or `TYPE:N`, or N below 1 (the message names `option`).
    """
    m = re.fullmatch(r"(?:([A-Za-z0-9_.-]+):)?(\d+)", raw.strip())
    if not m:
        raise ValueError(f"{option}: expected a GPU count N or Slurm's TYPE:N (e.g. 2 or a100:2), got {raw!r}")
    if int(m.group(2)) < 1:
        raise ValueError(f"{option}: must be at least 1, got {raw!r}")
    return m.group(1), int(m.group(2))


def gpu_count(raw: str, option: str) -> int:
    return gpu_spec(raw, option)[1]


@dataclass
class SbatchOptions:
    """What a script's `#SBATCH` lines ask: submission `fields`, `env` (the options recorded in the
    job's environment: cli/recorded.py), `warnings`, and `lines`, the line each field came from (so
    that the plane's refusal of a field names the script's line)."""

    fields: dict[str, object] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    container: dict[str, object] = field(default_factory=dict)  # pyxis's --container-* (cli/container_opts.py)


# Every long option an #SBATCH line may name: what a prefix (`--tim`) may stand for (cli/prefixes.py).
LONG_OPTIONS = frozenset(o for o in (*_FIELDS, *_FLAGS, *IGNORED, *recorded.ENV, *REFUSED, "--requeue",
                                      *container_flags.VALUED, *container_flags.FLAGS)
                         if o.startswith("--"))


def long_name(name: str, file: str, line: int) -> str:
    """`name` with an abbreviation expanded as sbatch does; unknown names are returned as they are."""
    try:
        return prefixes.expand(name, LONG_OPTIONS) or name
    except prefixes.AmbiguousOption as e:
        raise SbatchError(file, line, str(e)) from None


def _value(field_name: str, raw: str, file: str, line: int, option: str = "") -> object:
    try:
        if field_name == "datasets":
            return dataset_opts.parse(raw, option or "--dataset")
        if field_name in ("mem", "mem_per_gpu", "mem_per_cpu"):
            parse_mem_mib(raw)
            return raw.strip()
        if field_name in ("gpus_per_node", "gpus", "gpus_per_task"):
            return gpu_spec(raw, option or field_name)
        if field_name in ("constraint", "nodelist", "exclude"):
            try:
                if field_name == "constraint":
                    parse_features(raw.strip())
                elif not expand_hostlist(raw.strip()):
                    raise ValueError(f"no node names in {raw!r}")
            except ValueError as e:
                raise ValueError(f"{option or field_name}: {e}") from None
            return raw.strip()
        if field_name in ("tasks_per_node", "cpus_per_task", "ntasks"):
            if not raw.strip().isdigit():
                raise ValueError(f"expected a whole number, got {raw!r}")
            v = int(raw)
            if v < 1:
                raise ValueError("must be at least 1")
            return v
        if field_name == "nodes":
            lo, hi = parse_node_range(raw)
            return lo if lo == hi else f"{lo}-{hi}"
        if field_name == "time":
            limit = slurm_time(raw)
            if limit is not None:
                parse_duration(limit)
            return limit
        if field_name == "begin":
            parse_begin(raw, 0.0)  # checked here so that the error names the line; read at submission
            return raw
        if field_name == "signal":
            return parse_signal(raw, option or "--signal").text()
        if field_name == "export":
            parse_export(raw, option or "--export")
            return raw.strip()
        if field_name in ("output", "error"):
            if not raw.strip():
                raise ValueError(f"{option or '--' + field_name}: empty file name")
            return io_patterns.check(raw.strip(), option or f"--{field_name}")
        if field_name == "open_mode":
            return open_mode(raw, option or "--open-mode")
        if field_name == "mail_type":
            return parse_mail_type(raw, option or "--mail-type") or "NONE"
        if field_name == "mail_user":
            return check_mail_user(raw, option or "--mail-user")
        if field_name == "gres":
            kind, colon, count = raw.strip().partition(":")
            if kind.lower() == "none" and not colon:
                return None  # sbatch's --gres=none: no generic resources (a job still holds its GPUs)
            if kind != "gpu" or not colon:
                raise ValueError(f"expected gpu:N, gpu:TYPE:N or none, got {raw!r}")
            return gpu_spec(count, option or "--gres")
    except ValueError as e:
        named = option and str(e).startswith(option + ":")  # the message names the option already
        raise SbatchError(file, line, str(e) if named else f"{field_name}: {e}") from None
    if not raw.strip():
        raise SbatchError(file, line, f"{field_name}: empty value")
    return raw


def parse_sbatch(text: str, file: str = "script") -> SbatchOptions:
    out = SbatchOptions()
    for no, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if no == 1 and s.startswith("#!"):
            continue
        if not s:
            continue
        if not s.startswith("#"):
            break  # sbatch stops reading directives at the first command
        if not s.startswith("#SBATCH"):
            continue
        rest = s[len("#SBATCH"):]
        if rest and not rest[0].isspace():
            continue  # e.g. "#SBATCHX" is a plain comment
        try:
            words = shlex.split(rest, comments=True)
        except ValueError as e:
            raise SbatchError(file, no, f"cannot split the line: {e}") from None
        if not words:
            raise SbatchError(file, no, "#SBATCH with no option")
        i = 0
        while i < len(words):
            w = words[i]
            if not w.startswith("-"):
                raise SbatchError(file, no, f"expected an option, got {w!r}")
            name, eq, val = w.partition("=")
            name = recorded.SHORT.get(name, name)
            if name.startswith("--"):
                name = long_name(name, file, no)
            if refusal(name):
                raise SbatchError(file, no, str(refusal(name)))
            if name == "--requeue":  # what every trainyard job gets (cli/refused.py)
                i += 1
                continue
            if name in container_flags.FLAGS:
                key, flag = container_flags.FLAGS[name]
                out.container[key] = flag
                out.lines[f"container.{key}"] = no
                i += 1
                continue
            if name in _FLAGS:
                out.fields[_FLAGS[name]] = True
                out.lines[_FLAGS[name]] = no
                i += 1
                continue
            if name in recorded.OPTIONAL_VALUE and not eq:  # --get-user-env alone
                out.env.update([recorded.record(name, "")])
                i += 1
                continue
            takes_value = name in _FIELDS or name in IGNORED or name in recorded.ENV or name in container_flags.VALUED
            if not takes_value:
                if name.startswith("-") and not name.startswith("--") and len(name) > 2 and ("-" + name[1]) in _FIELDS:
                    name, val, eq = "-" + name[1], name[2:], "="  # -N2 style
                else:
                    raise SbatchError(file, no, f"unknown option {name!r}")
            if not eq:
                if i + 1 >= len(words):
                    raise SbatchError(file, no, f"option {name} needs a value")
                val = words[i + 1]
                i += 1
            i += 1
            if name in recorded.ENV:
                try:
                    out.env.update([recorded.record(name, val)])
                except ValueError as e:
                    raise SbatchError(file, no, str(e)) from None
                continue
            if name in container_flags.VALUED:
                if val + "#" in rest:  # enroot's REGISTRY#IMAGE, cut at its '#' as sbatch cuts a comment
                    raise SbatchError(file, no, f"{name}: '#' starts a comment in an #SBATCH line, as in sbatch, so "
                                                f"the image would be {val!r}; write it as REGISTRY/IMAGE "
                                                f"({val}/...) or escape the '#' ({val}\\#...)")
                try:
                    out.container[container_flags.VALUED[name]] = container_opts.value(name, val)
                except ValueError as e:
                    raise SbatchError(file, no, str(e)) from None
                out.lines[f"container.{container_flags.VALUED[name]}"] = no
                continue
            if name in IGNORED:
                out.warnings.append(f"{file}:{no}: {name} is ignored by trainyard")
                continue
            fname = _FIELDS[name]
            v = _value(fname, val, file, no, name)
            if fname == "gres" and v is None:  # --gres=none
                continue
            if isinstance(v, tuple):  # a GPU request: (model, count); the model is a placement constraint
                model, v = v
                if model:
                    out.fields["gpu_model"] = model
                    out.lines["gpu_model"] = no
            key = "gpus_per_node" if fname == "gres" else fname
            if key == "datasets":  # repeatable: each line adds its datasets, each named by its line
                have = out.fields.setdefault("datasets", [])
                assert isinstance(have, list) and isinstance(v, list)
                out.lines.update({f"datasets.{i}": no for i in range(len(have), len(have) + len(v))})
                out.lines.setdefault("datasets", no)
                have.extend(v)
                continue
            out.fields[key] = v
            out.lines[key] = no
    return out
