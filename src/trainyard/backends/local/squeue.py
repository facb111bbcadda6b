"""`squeue` inside a local-backend batch script: this job, in squeue's columns.

Usage (the `squeue` first on a batch script's PATH, `job_tools.py`):
    python -I -S local/squeue.py RUN_DIR [-h] [-j IDS] [--me] [-u USERS] [-p PARTS] [-t STATES] [-o FORMAT]

Why: scripts print `squeue -j $SLURM_JOB_ID` or `squeue --me` to their log, and a few read their
own time left with `squeue -h -j $SLURM_JOB_ID -o %L`. A job's token reads only its own job, so
inside a job the queue holds this job (the filters apply to it: `-j` another id, `-u` another
user, shows nothing, as squeue shows nothing that does not match). Default columns and
`-o` fields are squeue's (`%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R`; `%.N` right-aligns in N,
`%N` left-aligns, both cut to N).

Standard library only, run with -I -S from the attempt's copy of the tools; reads batch.json
(`local/jobview.py`).
"""

from __future__ import annotations

import os
import re
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if __package__:  # imported as trainyard.backends.local.backend.X (tests, the control plane)
    from trainyard.backends.local import jobview
else:  # run as a file with -I -S: by path, from this directory and the run-dir layer beside it
    sys.path[:0] = [_HERE, os.path.join(os.path.dirname(_HERE), "rundir")]
    import jobview  # type: ignore[no-redef]  # noqa: E402

DEFAULT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
HEADERS = {"i": "JOBID", "A": "JOBID", "P": "PARTITION", "j": "NAME", "u": "USER", "t": "ST", "T": "STATE",
           "M": "TIME", "l": "TIME_LIMIT", "L": "TIME_LEFT", "D": "NODES", "R": "NODELIST(REASON)", "N": "NODELIST",
           "C": "CPUS", "a": "ACCOUNT", "q": "QOS", "Z": "WORK_DIR", "o": "COMMAND", "S": "START_TIME"}
_FIELD = re.compile(r"%(\.)?(\d+)?([A-Za-z])")
_VALUED = {"-j": "jobs", "--jobs": "jobs", "-u": "users", "--user": "users", "-p": "parts", "--partition": "parts",
           "-t": "states", "--states": "states", "-o": "format", "--format": "format"}


class UsageError(Exception):
    pass


def parse(argv: list[str]) -> dict:
    opts: dict = {}
    i = 0
    while i < len(argv):
        w = argv[i]
        name, eq, val = w.partition("=")
        if name in ("-h", "--noheader"):
            opts["noheader"] = True
        elif name == "--me":
            opts["me"] = True
        elif name in ("-a", "--all", "-r", "--array", "-l", "--long"):
            pass  # every job we may see is shown already; arrays are one job each here
        elif name in _VALUED or (name[:2] in _VALUED and len(name) > 2 and not name.startswith("--")):
            if name not in _VALUED:
                name, val, eq = name[:2], name[2:], "="
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"option {name} needs a value")
                i += 1
                val = argv[i]
            opts[_VALUED[name]] = val
        else:
            raise UsageError(f"unrecognized option {w!r} (squeue here takes -h, -j, --me, -u, -p, -t, -o)")
        i += 1
    return opts


def values(batch: dict) -> dict[str, str]:
    f = jobview.fields(batch)
    limit = batch.get("time_limit_s")
    left = None if not limit else max(0.0, float(limit) - jobview.elapsed(batch))
    used = jobview.short_duration(jobview.elapsed(batch))
    return {"i": f["JobId"], "A": f["JobId"], "P": f["Partition"], "j": f["JobName"], "u": str(batch.get("user", "")),
            "t": "R", "T": "RUNNING", "M": used, "l": f["TimeLimit"],
            "L": "UNLIMITED" if left is None else jobview.duration(left), "D": f["NumNodes"], "R": f["NodeList"],
            "N": f["NodeList"], "C": f["NumCPUs"], "a": f["Account"], "q": f["QOS"], "Z": f["WorkDir"],
            "o": f["Command"], "S": f["StartTime"]}


def render(fmt: str, row: dict[str, str]) -> str:
    def one(m: re.Match) -> str:
        right, width, key = m.group(1), m.group(2), m.group(3)
        v = row.get(key, "")
        if width:
            v = v[: int(width)]
            v = v.rjust(int(width)) if right else v.ljust(int(width))
        return v
    return _FIELD.sub(one, fmt).rstrip()


def matches(batch: dict, opts: dict) -> bool:
    if "jobs" in opts and str(batch.get("job_id")) not in opts["jobs"].split(","):
        return False
    me = str(batch.get("user", ""))
    if opts.get("me") and os.getuid() != batch.get("uid"):
        return False
    if "users" in opts and me not in opts["users"].split(","):
        return False
    if "parts" in opts and (batch.get("info") or {}).get("pool") not in opts["parts"].split(","):
        return False
    if "states" in opts and not {s.upper() for s in opts["states"].split(",")} & {"R", "RUNNING", "ALL"}:
        return False
    return True


def main(argv: list[str]) -> int:
    if argv[:1] == ["--version"] or argv[1:2] == ["--version"]:
        print("squeue (trainyard's, for the local backend) 1")
        return 0
    run_dir, argv = (argv[0], argv[1:]) if argv else ("", [])
    try:
        opts = parse(argv)
        batch = jobview.load(run_dir)
    except (UsageError, jobview.ViewError) as e:
        print(f"squeue: error: {e}", file=sys.stderr)
        return 1
    fmt = opts.get("format", DEFAULT)
    if not opts.get("noheader"):
        print(render(fmt, {k: v for k, v in HEADERS.items()}))
    if matches(batch, opts):
        print(render(fmt, values(batch)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
