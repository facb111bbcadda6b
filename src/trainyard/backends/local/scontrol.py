"""`scontrol show hostnames|hostlist|job` inside a local-backend batch script.

Usage (the `scontrol` the local backend puts first on a batch script's PATH, `job_tools.py`):
    python -I -S local/scontrol.py RUN_DIR show hostnames [LIST]   one name a line; LIST defaults
                                                                   to $SLURM_JOB_NODELIST, as Slurm's
    python -I -S local/scontrol.py RUN_DIR show hostlist LIST      names (comma-separated) in hostlist form
    python -I -S local/scontrol.py RUN_DIR show job [ID]           this job, in Slurm's key=value layout

Why ours: a published multi-node script finds its rendezvous host with
`head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)`, and some print
`scontrol show job $SLURM_JOB_ID` to their log; on the local backend no Slurm is installed, and the
node names are the emulated ones. `show job` answers for this job (from its batch.json,
`local/jobview.py`); another job's id is refused (a job's token reads only its own job: `yard show`
for the rest). Anything else (update, requeue...) belongs to the control plane (`yard requeue`...),
refused with a message that says so (exit 1, as scontrol exits on an error).

Standard library only, run with -I -S; `contracts.py` (the hostlist functions) is loaded by path (by_path.py).
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if __package__:  # imported as trainyard.backends.local.backend.X (tests, the control plane)
    from trainyard.backends.local import jobview
    from trainyard.backends.rundir import by_path
else:  # run as a file with -I -S: by path, from this directory and the run-dir layer beside it
    sys.path[:0] = [_HERE, os.path.join(os.path.dirname(_HERE), "rundir")]
    import by_path  # type: ignore[no-redef]  # noqa: E402
    import jobview  # type: ignore[no-redef]  # noqa: E402


def _show_job(run_dir: str, rest: list[str]) -> int:
    try:
        batch = jobview.load(run_dir)
    except jobview.ViewError as e:
        print(f"scontrol: error: {e}", file=sys.stderr)
        return 1
    if len(rest) > 1 or (rest and rest[0] != str(batch.get("job_id"))):
        print(f"slurm_load_jobs error: Invalid job id specified: {' '.join(rest)} (inside job {batch.get('job_id')} "
              "scontrol shows this job only; yard show ID for the others)", file=sys.stderr)
        return 1
    sys.stdout.write(jobview.show_job(batch))
    return 0


def main(argv: list[str], environ: dict[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    if argv[:1] == ["--version"] or argv[1:2] == ["--version"]:
        print("scontrol (trainyard's, for the local backend) 1")
        return 0
    run_dir, argv = (argv[0], argv[1:]) if argv else ("", [])
    if len(argv) >= 2 and argv[0] == "show" and argv[1] == "job":
        return _show_job(run_dir, argv[2:])
    if len(argv) < 2 or argv[0] != "show" or argv[1] not in ("hostnames", "hostname", "hostlist"):
        print(f"scontrol: {' '.join(argv) or '(nothing)'}: only 'show hostnames [LIST]', 'show hostlist LIST' and "
              "'show job [ID]' run inside a trainyard job on the local backend (yard show, yard requeue... for the "
              "rest)", file=sys.stderr)
        return 1
    contracts = by_path.load("contracts")
    what, rest = argv[1], argv[2:]
    if what == "hostlist":
        if len(rest) != 1:
            print("scontrol: show hostlist takes one comma-separated list of names", file=sys.stderr)
            return 1
        print(contracts.compress_hostlist([n for n in rest[0].split(",") if n]))
        return 0
    expr = rest[0] if rest else env.get("SLURM_JOB_NODELIST", "")
    if len(rest) > 1 or not expr:
        print("scontrol: show hostnames takes one hostlist (default: $SLURM_JOB_NODELIST, unset here)",
              file=sys.stderr)
        return 1
    try:
        names = contracts.expand_hostlist(expr)
    except ValueError as e:
        print(f"scontrol: {e}", file=sys.stderr)
        return 1
    sys.stdout.write("".join(n + "\n" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
