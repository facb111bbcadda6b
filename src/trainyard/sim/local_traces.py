"""Where this machine keeps a copy of the public traces the benchmarks and some tests replay.

The repository holds no trace: they are third-party data (docs/design.md, "Data at hand").
`yard trace fetch` downloads the pinned files into `<data dir>/traces/`; a machine that already
carries a copy in the traces' published layout (`philly/philly_jobs_adaptdl_until_2017-10-28.csv`,
`pollux-sia-workloads/pollux_workloads/workload-N.csv`, …) names that folder in `TRAINYARD_TRACES`.
The benchmarks take it as their default and the tests that need a trace skip, saying so, where it
is not set — nothing in the repository names a path outside it.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "TRAINYARD_TRACES"
PHILLY_JOBS = "philly/philly_jobs_adaptdl_until_2017-10-28.csv"
PHILLY_VC_NODES = "philly/philly_vc_nodes_heliosartifact.csv"
POLLUX = "pollux-sia-workloads"
POLLUX_WORKLOADS = "pollux-sia-workloads/pollux_workloads"
MISSING = f"the public traces are not on this machine (set {ENV} to the folder that holds them)"


def traces_root() -> Path | None:
    """The folder `TRAINYARD_TRACES` names, if it is set and is a folder."""
    value = os.environ.get(ENV, "").strip()
    return Path(value) if value and Path(value).is_dir() else None


def local_trace(relative: str) -> Path | None:
    """`relative` (one of the constants above) under the traces folder, where both exist."""
    root = traces_root()
    path = root / relative if root is not None else None
    return path if path is not None and path.exists() else None
