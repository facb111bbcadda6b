"""Backends: where job processes actually run.

The interface is in `base` (read its docstring first); `registry` finds a backend by name;
`local` runs ranks on this machine, `slurm` on an existing Slurm cluster, `fake` runs scripted
ranks on a fake clock for tests of the control loop. Only light standard-library modules are
imported here, so importing the package stays cheap.
"""

from trainyard.backends.base import (
    AttemptState,
    Backend,
    BackendError,
    LaunchSpec,
    Limits,
    NodeInfo,
    Owner,
    RankState,
)
from trainyard.backends.local.backend import LocalBackend, detect_local_nodes

__all__ = [
    "AttemptState",
    "Backend",
    "BackendError",
    "LaunchSpec",
    "Limits",
    "LocalBackend",
    "NodeInfo",
    "Owner",
    "RankState",
    "detect_local_nodes",
]
