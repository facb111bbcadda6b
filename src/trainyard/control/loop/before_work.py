"""The before-work gate (Slurm's HealthCheckProgram at registration, NHC in a prolog).

A node takes new work only on a round of its checks that passed, started within
`health.before_work_max_age` and, when a person resumed the node, after that. A node that could
take some of the waiting work (free GPUs, a pool a waiting job asks for) gets a before-work round
in the background; the loop never waits for it, and the round's end wakes the loop. A round that
finds a problem acts like a periodic one (`node_watch`: WARN → suspect, CRITICAL → down).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainyard.control.loop.context import HEALTH
from trainyard.control.health import HealthChecker, worst
from trainyard.services.config import ConfigVersion
from trainyard.spec.pilot import effective_for
from trainyard.store.models import JobRow, NodeRow


def gate(health: HealthChecker, cfg: ConfigVersion, states: dict[str, NodeRow], unhealthy: Sequence[str],
         running: Sequence[JobRow], pending: Sequence[Any], now: float) -> tuple[set[str], bool]:
    """The nodes that may not take work now, and whether a round is under way for one of them
    (then the schedule step starts no preemption: the node may be free for the job in a moment)."""
    if not any(effective_for(cfg.spec, n.name).health.checks for n in cfg.nodes):
        return set(), False
    used: dict[str, int] = {}
    for j in running:
        for part in j.placement or []:
            used[part["node"]] = used.get(part["node"], 0) + len(part["gpus"])
    pools = {p.pool for p in pending}
    unchecked, checking = set(), False
    for n in cfg.nodes:
        hspec = effective_for(cfg.spec, n.name).health  # a pilot node's trial (spec/pilot.py)
        horizon = now - hspec.before_work_max_age
        row = states.get(n.name)
        wanted = n.pool in pools
        if n.name in unhealthy:
            continue
        if row is not None and row.state != "up":
            # no work for it anyway; but one its checks took down is checked again as often
            # while work waits for its pool, so that it returns as soon as it passes
            if row.state == "down" and row.updated_by == HEALTH and wanted \
                    and not health.fresh(n.name, hspec, max(horizon, row.updated_at)):
                health.request(n.name)
                checking = True
            continue
        since = horizon if row is None or row.updated_by == HEALTH else max(horizon, row.updated_at)
        if health.fresh(n.name, hspec, since) and worst(health.results(n.name, hspec)) is None:
            continue
        unchecked.add(n.name)
        if wanted and used.get(n.name, 0) < n.gpus:
            health.request(n.name)
            checking = True
    return unchecked, checking
