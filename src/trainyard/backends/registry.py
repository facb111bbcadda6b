"""Backends by name: what the control plane needs to pick one without knowing any.

Each backend module registers a `BackendKind` when imported; `get(name)` imports the built-in
ones on first use, so a lookup costs nothing until a backend is asked for. The control plane
(`control/lifecycle/plane_builder.py`) then does, for the kind `yard up --backend NAME` named:

    kind.check(options)                    before anything is stored: can it run here at all?
    kind.discover(data_dir, options)       only when no configuration is stored yet: the nodes
                                           (name, GPUs, model, GPU memory, block, rack) for a
                                           default one
    kind.create(data_dir, nodes, options)  the backend, on the *configured* nodes (GPU memory and
                                           topology are the configuration's, whatever the backend
                                           can find out itself)

`options` are the backend's own settings, by name: `nodes` and `gpus_per_node` (the local and fake
backends' emulated cluster), `partition` (Slurm's), `job_python` (a kind that runs the in-job
tools), `containment` and `private_tmp` (the local one's cells). A kind declares which it takes,
so `yard up` refuses the others naming the flag, and the plane's builder
(`control/lifecycle/plane_builder.py`) hands it only those (`BackendKind.take`). Everything else goes through the `Backend` protocol
(`backends/base.py`); a new backend (Kubernetes, Ray) adds a module that registers a kind, one
line in `_BUILTIN`, and a fixture in the conformance suite (tests/backends/conformance.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainyard.backends.base import Backend, NodeInfo

Options = Mapping[str, Any]

# name -> the module that registers it (imported on the first lookup)
_BUILTIN = {"local": "trainyard.backends.local.backend", "slurm": "trainyard.backends.slurm.backend", "fake": "trainyard.backends.fake"}
_KINDS: dict[str, BackendKind] = {}


def _no_check(options: Options) -> None:
    return None


@dataclass(frozen=True)
class BackendKind:
    """One backend, as the control plane sees it before it has one (see the module docstring).

    Args:
        name: what `yard up --backend` takes.
        summary: one line for `yard up --help`.
        create: (data dir, configured nodes, options) -> the backend.
        discover: (data dir, options) -> nodes for a default configuration.
        options: the option names it takes.
        check: raises `BackendError` saying why it cannot run here (e.g. Slurm's commands missing).
        node_options: the options that describe the nodes themselves: given, a start discovers
            them anew over a stored configuration (`yard up --nodes 2`).
    """

    name: str
    summary: str
    create: Callable[[Path, list[NodeInfo], Options], Backend]
    discover: Callable[[Path, Options], list[NodeInfo]]
    options: frozenset[str] = field(default_factory=frozenset)
    check: Callable[[Options], None] = _no_check
    node_options: frozenset[str] = field(default_factory=frozenset)

    def take(self, given: Options) -> dict[str, Any]:
        """The options of `given` this kind takes and that have a value; the rest are another
        kind's (`yard up` refuses those first, naming the flag)."""
        return {k: v for k, v in given.items() if v is not None and k in self.options}


def register(kind: BackendKind) -> None:
    """Make `kind` known by its name; registering a name again replaces it (a test's own kind)."""
    _KINDS[kind.name] = kind


def names() -> list[str]:
    """Every backend name, built-in ones first."""
    return list(dict.fromkeys([*_BUILTIN, *_KINDS]))


def get(name: str) -> BackendKind:
    """The kind registered as `name`.

    Raises:
        ValueError: no backend has that name (the message lists those that do).
    """
    if name not in _KINDS and name in _BUILTIN:
        importlib.import_module(_BUILTIN[name])
    kind = _KINDS.get(name)
    if kind is None:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(names())}")
    return kind
