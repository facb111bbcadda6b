"""A stored placement's ranks: the rows of `jobs.placement` read back into `contracts.RankPlacement`s.

The store keeps a placement per node (`{"node", "gpus", "mem_mib"}` rows, in Slurm's node order);
the plane's reconcile step and the API's world size ask which rank ran where after the fact, and
get it by the very rule the schedule step launched with (`contracts.ranks_of`).
"""

from __future__ import annotations

from typing import Any

from trainyard.contracts import RankPlacement, ranks_of


def ranks_for(placement: list[dict[str, Any]], tasks_per_node: int | None) -> list[RankPlacement]:
    """One rank per GPU (or `tasks_per_node` ranks sharing a node's GPUs evenly), in node order."""
    return ranks_of(((part["node"], list(part["gpus"])) for part in placement), tasks_per_node)
