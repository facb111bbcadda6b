"""The checks every backend makes of a `LaunchSpec` before it starts anything, written once.

A launch is all-or-none (base.py): a spec that names a rank twice, a node the backend does not
have, a GPU the node does not have, or a node that is not up must fail before any rank starts,
with the same words on every backend (the conformance suite, tests/backends/conformance.py, asks
each backend the same questions). What only one backend can check (the fake's workdir on its own
file system, the local backend's as the job's owner) it checks after this.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from trainyard.backends.base import BackendError, LaunchSpec, NodeInfo


def check_launch(spec: LaunchSpec, where: str, nodes: Mapping[str, NodeInfo], state_of: Callable[[str], str],
                 launched: bool) -> None:
    """Raise `BackendError` (its message starting with `where`) when `spec` cannot be launched on
    `nodes` (`state_of(name)`: a node's state, "up" when it takes work; `launched`: this attempt
    runs already).

    Raises:
        BackendError: an empty command, ranks that are not 0..n-1, an unknown node or GPU, a node
            that is not up, or an attempt launched already.
    """
    if not spec.command:
        raise BackendError(f"{where}: empty command")
    if not spec.ranks or sorted(r.rank for r in spec.ranks) != list(range(len(spec.ranks))):
        raise BackendError(f"{where}: ranks must be 0..n-1, got {[r.rank for r in spec.ranks]}")
    for r in spec.ranks:
        node = nodes.get(r.node)
        if node is None:
            raise BackendError(f"{where}: rank {r.rank} placed on unknown node {r.node!r}")
        bad = [g for g in r.gpus if not 0 <= g < node.gpus]
        if bad:
            raise BackendError(f"{where}: rank {r.rank}: {r.node} has no GPU {bad} (it has {node.gpus})")
    for name in sorted({r.node for r in spec.ranks}):
        if (state := state_of(name)) != "up":
            raise BackendError(f"{where}: placed on {name}, which is {state}")
    if launched:
        raise BackendError(f"{where}: already launched (release it first)")
