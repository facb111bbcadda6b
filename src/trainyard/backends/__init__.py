"""Backends: where job processes actually run (local processes today, Slurm later).

The interface is in `base` (read its docstring first); `local` runs ranks on this machine. Only
light standard-library modules are imported here, so importing the package stays cheap.
"""

from trainyard.backends.base import (
    AttemptState,
    Backend,
    BackendError,
    LaunchSpec,
    NodeInfo,
    RankLaunch,
    RankState,
)
from trainyard.backends.local import LocalBackend, detect_local_nodes

__all__ = [
    "AttemptState",
    "Backend",
    "BackendError",
    "LaunchSpec",
    "LocalBackend",
    "NodeInfo",
    "RankLaunch",
    "RankState",
    "detect_local_nodes",
]
