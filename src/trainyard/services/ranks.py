"""How a placement becomes ranks: one rank per GPU, or `tasks_per_node` ranks sharing each node's GPUs.

The control loop launches these, the API reports a job's world size from them, and the fault
handling maps a failed rank back to its node with them, so the rule lives in one place.
"""

from __future__ import annotations

from typing import Any

from trainyard.backends.base import RankLaunch


def ranks_for(placement: list[dict[str, Any]], tasks_per_node: int | None) -> list[RankLaunch]:
    """One rank per GPU (or `tasks_per_node` ranks sharing a node's GPUs evenly), in node order."""
    out: list[RankLaunch] = []
    for part in placement:
        gpus = list(part["gpus"])
        k = tasks_per_node or len(gpus)
        per = max(1, len(gpus) // k)
        for t in range(k):
            out.append(RankLaunch(len(out), part["node"], tuple(gpus[t * per:(t + 1) * per])))
    return out
