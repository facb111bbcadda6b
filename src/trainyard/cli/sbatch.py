"""`#SBATCH` lines of a batch script → submission fields, as `sbatch` reads them.

As in Slurm, directives are read from the top of the script until the first line that is
neither blank nor a comment; options on the command line win over the script's. Supported:
`-N/--nodes`, `--gres=gpu[:type]:N`, `--gpus-per-node`, `-G/--gpus`, `-t/--time`, `-J/--job-name`,
`--qos` (→ class), `-A/--account` (→ team), `-o/--output`, `-p/--partition` (→ pool),
`--ntasks-per-node`, `-D/--chdir`, `-H/--hold`, `-d/--dependency`, `-b/--begin`, `-a/--array`. Options that make sense to Slurm but not here
(`--mem`, `--cpus-per-task`, `--mail-*`, …) are ignored with a warning; anything else is an error
that names the line.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from trainyard.parsing import parse_begin, parse_duration, parse_node_range


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
    "--qos": "class",
    "-A": "team", "--account": "team",
    "-o": "output", "--output": "output",
    "-p": "pool", "--partition": "pool",
    "--ntasks-per-node": "tasks_per_node",
    "-D": "workdir", "--chdir": "workdir",
    "--gres": "gres",
    "-d": "dependency", "--dependency": "dependency",
    "-b": "begin", "--begin": "begin",
    "-a": "array", "--array": "array",
}
_FLAGS = {"-H": "hold", "--hold": "hold"}
IGNORED = {"--mem", "--mem-per-cpu", "--mem-per-gpu", "-c", "--cpus-per-task", "--mail-type", "--mail-user",
           "-e", "--error", "--exclusive", "--requeue", "--no-requeue", "-n", "--ntasks", "--constraint", "-C",
           "--open-mode", "--signal", "--comment"}


def slurm_time(raw: str) -> str:
    """Slurm reads a bare `--time` number as minutes; trainyard's durations read it as seconds."""
    return f"{raw.strip()}m" if raw.strip().isdigit() else raw


@dataclass
class SbatchOptions:
    fields: dict[str, object] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _value(field_name: str, raw: str, file: str, line: int) -> object:
    try:
        if field_name in ("gpus_per_node", "gpus", "tasks_per_node"):
            v = int(raw)
            if v < 1:
                raise ValueError("must be at least 1")
            return v
        if field_name == "nodes":
            lo, hi = parse_node_range(raw)
            return lo if lo == hi else f"{lo}-{hi}"
        if field_name == "time":
            raw = slurm_time(raw)
            parse_duration(raw)
            return raw
        if field_name == "begin":
            parse_begin(raw, 0.0)  # checked here so that the error names the line; read at submission
            return raw
        if field_name == "gres":
            m = re.fullmatch(r"gpu(?::[A-Za-z0-9_.-]+)?:(\d+)", raw.strip())
            if not m or int(m.group(1)) < 1:
                raise ValueError(f"expected gpu:N or gpu:TYPE:N, got {raw!r}")
            return int(m.group(1))
    except ValueError as e:
        raise SbatchError(file, line, f"{field_name}: {e}") from None
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
            if name in _FLAGS:
                out.fields[_FLAGS[name]] = True
                i += 1
                continue
            takes_value = name in _FIELDS or name in IGNORED
            if not takes_value:
                if name.startswith("-") and not name.startswith("--") and len(name) > 2 and ("-" + name[1]) in _FIELDS:
                    name, val, eq = "-" + name[1], name[2:], "="  # -N2 style
                else:
                    raise SbatchError(file, no, f"unknown option {name!r}")
            if not eq:
                if name in IGNORED and name in ("--exclusive", "--requeue", "--no-requeue"):
                    out.warnings.append(f"{file}:{no}: {name} is ignored by trainyard")
                    i += 1
                    continue
                if i + 1 >= len(words):
                    raise SbatchError(file, no, f"option {name} needs a value")
                val = words[i + 1]
                i += 1
            i += 1
            if name in IGNORED:
                out.warnings.append(f"{file}:{no}: {name} is ignored by trainyard")
                continue
            fname = _FIELDS[name]
            v = _value(fname, val, file, no)
            if fname == "gres":
                out.fields["gpus_per_node"] = v
            else:
                out.fields[fname] = v
    return out
