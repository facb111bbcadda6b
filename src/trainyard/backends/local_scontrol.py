"""`scontrol show hostnames` and `scontrol show hostlist` inside a local-backend batch script.

Usage (the `scontrol` the local backend puts first on a batch script's PATH):
    python -I -S local_scontrol.py show hostnames [LIST]   one name a line; LIST defaults to
                                                           $SLURM_JOB_NODELIST, as Slurm's does
    python -I -S local_scontrol.py show hostlist LIST      names (comma-separated) in hostlist form

Why ours: a published multi-node script finds its rendezvous host with
`head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)`; on the local backend no
Slurm is installed, and the node names are the emulated ones. Anything else `scontrol` does
(show job, update, requeue...) belongs to the control plane (`yard show`, `yard requeue`), so it
is refused with a message that says so (exit 1, as scontrol exits on an error).

Standard library only, run with -I -S; `contracts.py` (the hostlist functions) is loaded by path (by_path.py).
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if __package__:  # imported as trainyard.backends.X (tests, the control plane)
    from trainyard.backends import by_path
else:  # run as a file with -I -S: the sibling, by path
    sys.path.insert(0, _HERE)
    import by_path  # type: ignore[no-redef]  # noqa: E402


def main(argv: list[str], environ: dict[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    if len(argv) < 2 or argv[0] != "show" or argv[1] not in ("hostnames", "hostname", "hostlist"):
        print(f"scontrol: {' '.join(argv) or '(nothing)'}: only 'show hostnames [LIST]' and 'show hostlist LIST' "
              "run inside a trainyard job on the local backend (yard show, yard requeue... for the rest)",
              file=sys.stderr)
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
