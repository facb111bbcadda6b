"""Load one of trainyard's own modules by its file path, for the scripts that run with `python -I -S`.

The rank runner's helpers (`slurm/task.py`, `local/srun.py`, `local/scontrol.py`) run as
`python -I -S FILE`: no site-packages and no environment variables, so nothing in a job's
environment (PYTHONPATH, a `trainyard` of the user's) can change how a rank starts. They still
need `contracts.py` (the job environment, hostlists) and `ports.py`; this loads such a module from
the package directory beside this file, the one the control plane itself runs.

Standard library only.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # trainyard/backends/rundir/


def load(name: str) -> ModuleType:
    """`trainyard/<name>.py`, loaded once by path as `_trainyard_<name>`."""
    key = f"_trainyard_{name}"
    if key in sys.modules:
        return sys.modules[key]
    path = os.path.join(PACKAGE_DIR, f"{name}.py")
    spec = importlib.util.spec_from_file_location(key, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[key] = mod  # dataclasses look their module up while the classes are made
    spec.loader.exec_module(mod)
    return mod
