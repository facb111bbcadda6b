"""`sinfo` inside a local-backend batch script: the cluster's nodes, in sinfo's default columns.

Usage (the `sinfo` first on a batch script's PATH, `job_tools.py`):
    python -I -S local/sinfo.py RUN_DIR [-h] [-N]

Why: scripts log `sinfo` before they start, and some count nodes with `sinfo -h -N`. The
columns are sinfo's (PARTITION AVAIL TIMELIMIT NODES STATE NODELIST, one line per partition and
state). This job's nodes are `alloc` (every GPU of the node is the job's) or `mix`; a job's token
cannot read the other nodes' state, so they show as `unk` (Slurm's word for a state it does not
know) — the plane's view is `yard nodes`. The partition is the job's (`*` as the default).

Standard library only, run with -I -S from the attempt's copy of the tools (`local/jobview.py`).
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


def node_states(batch: dict) -> dict[str, str]:
    """Every node of the cluster (this job's first) and its sinfo state."""
    mine = jobview.job_nodes(batch)
    gpus_of = {n["name"]: int(n.get("gpus") or 0) for n in batch.get("cluster_nodes") or []}
    used = {n: len(g) for n, g in (batch.get("node_gpus") or {}).items()}
    out = {n: "alloc" if used.get(n, 0) >= gpus_of.get(n, 0) else "mix" for n in mine}
    for n in gpus_of:
        out.setdefault(n, "unk")
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["--version"] or argv[1:2] == ["--version"]:
        print("sinfo (trainyard's, for the local backend) 1")
        return 0
    run_dir, argv = (argv[0], argv[1:]) if argv else ("", [])
    bad = [a for a in argv if a not in ("-h", "--noheader", "-N", "--Node", "-a", "--all", "-l", "--long")]
    if bad:
        print(f"sinfo: error: unrecognized option {bad[0]!r} (sinfo here takes -h, -N)", file=sys.stderr)
        return 1
    try:
        batch = jobview.load(run_dir)
    except jobview.ViewError as e:
        print(f"sinfo: error: {e}", file=sys.stderr)
        return 1
    contracts = by_path.load("contracts")
    part = ((batch.get("info") or {}).get("pool") or "default") + "*"
    states = node_states(batch)
    noheader = "-h" in argv or "--noheader" in argv
    if "-N" in argv or "--Node" in argv:  # one line per node: NODELIST NODES PARTITION STATE
        if not noheader:
            print(f"{'NODELIST':<9} {'NODES':>5} {'PARTITION':<9} {'STATE':<5}")
        for n, st in states.items():
            print(f"{n:<9} {1:>5} {part:<9} {st:<5}")
        return 0
    if not noheader:
        print(f"{'PARTITION':<9} {'AVAIL':<5} {'TIMELIMIT':>10} {'NODES':>6} {'STATE':>6} NODELIST")
    for st in dict.fromkeys(states.values()):
        names = [n for n, s in states.items() if s == st]
        print(f"{part:<9} {'up':<5} {'infinite':>10} {len(names):>6} {st:>6} {contracts.compress_hostlist(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
