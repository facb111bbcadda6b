"""`yard queue`'s columns, and `--format`/`-o` as squeue reads it.

Two ways to choose columns, both squeue's:

    yard queue -o "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"    printf-like: %[.][size]letter
    yard queue -O jobid,user,state,reason:40                    names, each [:[.]size]

In the `%` form the text between fields is printed as it is, a size pads and cuts the value to
that many characters ('.' right-aligns it), and a field with no size is printed whole, as squeue
does. In the names form (also `-o` when it holds no '%') the columns are aligned, a size fixes
one's most (a longer value is cut, ending in "…"), and the others fit the terminal as the default layout does (`cli/columns.py`). The
letters are squeue's (`FIELDS` lists them with trainyard's names: team for account, pool for
partition, class for QOS); an unknown letter or name is an error naming the option.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Callable

from trainyard.cli.columns import Column, cut, render
from trainyard.cli.render import ago, clock, duration, nodelist
from trainyard.states import STATE_CODES

CODE_OF = {state.value: code for code, state in STATE_CODES.items()}
API_FIELDS = ("id,name,team,user,class,pool,state,reason,start_time,submit_time,end_time,time_limit_s,nodes_min,"
              "nodes_max,gpus,gpus_per_node,placement,est_start,array_job_id,array_task_id")


def _running(j: dict) -> bool:
    return j["state"] in ("RUNNING", "COMPLETING")


def shown_id(j: dict) -> str:
    """As squeue shows it: an array's task as ARRAY_TASK, any other job by its id."""
    return str(j["id"]) if j.get("array_job_id") is None else f"{j['array_job_id']}_{j['array_task_id']}"


def _time_used(j: dict, now: float) -> str:
    """squeue's TIME: how long it has run; 0:00 for a job that waits (its wait is not run time)."""
    if _running(j):
        return ago(j["start_time"], now)
    return "0:00" if j["state"] in ("PENDING", "REQUEUED") else ""


def _gpus(j: dict) -> str:
    size = f"{j['nodes_min']}" if j["nodes_min"] == j["nodes_max"] else f"{j['nodes_min']}-{j['nodes_max']}"
    return str(j["gpus"]) if j["gpus_per_node"] is None else f"{size}x{j['gpus_per_node']}"


def _time_left(j: dict, now: float) -> str:
    if j.get("time_limit_s") is None:
        return "UNLIMITED"
    used = now - j["start_time"] if _running(j) and j["start_time"] else 0.0
    return duration(j["time_limit_s"] - used)


@dataclass(frozen=True)
class Field:
    letter: str | None  # squeue's %-letter
    names: tuple[str, ...]  # for -O (any case); the first is trainyard's
    header: str
    show: Callable[[dict, float], str]
    cut: bool = False  # may be cut to fit the terminal in the aligned layouts
    right: bool = False


FIELDS: tuple[Field, ...] = (
    Field("i", ("id", "jobarrayid"), "JOBID", lambda j, now: shown_id(j)),
    Field("A", ("jobid",), "JOBID", lambda j, now: str(j["id"])),
    Field("F", ("arrayjobid",), "ARRAY_JOB_ID", lambda j, now: str(j.get("array_job_id") or j["id"])),
    Field("K", ("arraytaskid",), "ARRAY_TASK_ID", lambda j, now: "N/A" if j.get("array_task_id") is None
          else str(j["array_task_id"])),
    Field("j", ("name", "jobname"), "NAME", lambda j, now: j["name"], cut=True),
    Field("u", ("user", "username"), "USER", lambda j, now: j["user"]),
    Field("a", ("team", "account"), "TEAM", lambda j, now: j["team"]),
    Field("P", ("pool", "partition"), "POOL", lambda j, now: j.get("pool") or ""),
    Field("q", ("class", "qos"), "CLASS", lambda j, now: j["class"]),
    Field("T", ("state",), "STATE", lambda j, now: j["state"]),
    Field("t", ("st", "statecompact"), "ST", lambda j, now: CODE_OF.get(j["state"], j["state"])),
    Field("M", ("time", "timeused"), "TIME", _time_used, right=True),
    Field("l", ("timelimit",), "TIME_LIMIT", lambda j, now: "UNLIMITED" if j.get("time_limit_s") is None
          else duration(j["time_limit_s"]), right=True),
    Field("L", ("timeleft",), "TIME_LEFT", _time_left, right=True),
    Field("D", ("nodes", "numnodes"), "NODES", lambda j, now: str(j["nodes_min"]) if j["nodes_min"] == j["nodes_max"]
          else f"{j['nodes_min']}-{j['nodes_max']}", right=True),
    Field("b", ("gpus", "tres-per-node"), "GPUS", lambda j, now: _gpus(j), right=True),
    Field(None, ("est_start", "eststart"), "EST.START", lambda j, now: "" if _running(j)
          else clock(j.get("est_start"), now)),
    Field("S", ("starttime", "start"), "START_TIME", lambda j, now: clock(j["start_time"] if j.get("start_time")
                                                                          else j.get("est_start"), now)),
    Field("V", ("submittime", "submit"), "SUBMIT_TIME", lambda j, now: clock(j["submit_time"], now)),
    Field("e", ("endtime", "end"), "END_TIME", lambda j, now: clock(j.get("end_time"), now)),
    Field("r", ("reason",), "REASON", lambda j, now: "None" if _running(j) else j["reason"] or "None", cut=True),
    Field("N", ("nodelist",), "NODELIST", lambda j, now: nodelist(j["placement"]) if _running(j) else "", cut=True),
    Field("R", ("reasonlist", "nodelist(reason)"), "NODELIST(REASON)",
          lambda j, now: nodelist(j["placement"]) if _running(j) else f"({j['reason'] or 'None'})", cut=True),
    # its image (pyxis's --container-image, normalised): asked of the API only when shown (`api_fields`)
    Field(None, ("image", "container"), "IMAGE", lambda j, now: (j.get("container") or {}).get("image") or "",
          cut=True),
)
BY_LETTER = {f.letter: f for f in FIELDS if f.letter}
BY_NAME = {n: f for f in FIELDS for n in f.names}
DEFAULT = "id,name,team,user,class,state,time,gpus,est_start,reasonlist"


def api_fields(shape: "Layout") -> str:
    """The job keys to ask the API for: `API_FIELDS`, and the container record only when a column
    shows it (a JSON document per job the queue otherwise never decodes)."""
    return API_FIELDS + (",container" if any(f.names[0] == "image" for f, _, _ in shape.fields) else "")


class FormatError(ValueError):
    """A format the option cannot use; the message names the option and the part."""


@dataclass
class Layout:
    """A chosen set of columns and how to print them."""

    fields: list[tuple[Field, int | None, bool]]  # field, size (None: whole/fitted), right-aligned
    literals: list[str] | None = None  # the % form: text before each field, and after the last

    def lines(self, jobs: list[dict[str, Any]], width: int | None, header: bool = True, now: float | None = None
              ) -> list[str]:
        now = time.time() if now is None else now
        values = [[f.show(j, now) for f, _, _ in self.fields] for j in jobs]
        if self.literals is not None:
            return self._printf(values, header)
        cols = [Column(f.header, cut=f.cut and size is None, right=right) for f, size, right in self.fields]
        sized = [[v if size is None else cut(v, size) for v, (_, size, _) in zip(r, self.fields)] for r in values]
        return render(cols, sized, width, header=header)

    def _printf(self, values: list[list[str]], header: bool) -> list[str]:
        literals = self.literals
        assert literals is not None

        def line(cells: list[str]) -> str:
            out = []
            for lit, (_, size, right), v in zip(literals, self.fields, cells):
                if size is not None:
                    v = v[:size]
                    v = v.rjust(size) if right else v.ljust(size)
                out += [lit, v]
            return ("".join(out) + literals[-1]).rstrip()

        rows = [line([f.header for f, _, _ in self.fields])] if header else []
        return rows + [line(r) for r in values]


_SPEC = re.compile(r"%(\.?)(\d*)([A-Za-z%])")


def parse_printf(text: str, option: str = "--format") -> Layout:
    """squeue's `-o` form: `%[.][size]letter` fields among literal text; `%%` is a '%'."""
    fields: list[tuple[Field, int | None, bool]] = []
    literals, pos, lit = [], 0, ""
    for m in _SPEC.finditer(text):
        lit += text[pos:m.start()]
        pos = m.end()
        dot, size, letter = m.groups()
        if letter == "%":
            lit += "%"
            continue
        f = BY_LETTER.get(letter)
        if f is None:
            raise FormatError(f"{option}: unknown field %{letter} (known: {' '.join('%' + k for k in BY_LETTER)})")
        fields.append((f, int(size) if size else None, bool(dot)))
        literals.append(lit)
        lit = ""
    rest = lit + text[pos:]
    if "%" in rest:
        raise FormatError(f"{option}: a '%' with no field letter in {text!r}")
    if not fields:
        raise FormatError(f"{option}: no field in {text!r} (e.g. \"%.8i %u %t %R\")")
    return Layout(fields, literals + [rest])


def parse_names(text: str, option: str = "--Format") -> Layout:
    """squeue's `-O` form: `name[:[.]size]`, comma-separated, any case."""
    fields: list[tuple[Field, int | None, bool]] = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        name, _, size = part.partition(":")
        f = BY_NAME.get(name.lower())
        if f is None:
            raise FormatError(f"{option}: unknown field {name!r} (known: {', '.join(BY_NAME)})")
        right = size.startswith(".")
        size = size.lstrip(".")
        if size and not (size.isdigit() and int(size) > 0):
            raise FormatError(f"{option}: {part!r}: the size must be a whole number of characters")
        fields.append((f, int(size) if size else None, right or f.right))
    if not fields:
        raise FormatError(f"{option}: no field (e.g. id,user,state,reason:40)")
    return Layout(fields)


def layout(fmt: str | None, names: str | None) -> Layout:
    """The layout `-o FORMAT` / `-O NAMES` ask for (`-o` without a '%' is read as names), else the default."""
    if fmt is not None and names is not None:
        raise FormatError("--format/-o and --Format/-O: give one of them")
    if fmt is not None:
        return parse_printf(fmt) if "%" in fmt else parse_names(fmt, "--format")
    return parse_names(names if names is not None else DEFAULT)
