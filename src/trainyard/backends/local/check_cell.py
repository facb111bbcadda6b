"""A cell on an emulated node for a health check's processes, slowed as the node's ranks are.

Why: the `speed` check (control/health/speed.py) must measure what a job on the node would get.
On one machine that plays several nodes the only thing that makes node-1 slower than node-0 is
`yard chaos slow-node`'s CPU quota on node-1's ranks (`contain.cpu_quota`), so a check run
beside them in the plane's own cgroup would measure the machine, never the node. Here the check's
child joins a cgroup of its own under the node's level, `<base>/speed.<node>/<node>/r0`, made by the
containment driver as a rank's is, with the quota a rank without --cpus-per-task gets there: one
CPU divided by the node's slowdown factor, or no limit when the node is not slowed (the check's
CPU path measures one rank at a time on one thread, so one CPU is what it uses unslowed).

The cell is made before the check and killed and removed after it (whatever the check left). In
the subreaper mode there is no cgroup: the check runs where the plane does, as on a real node.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from trainyard.backends.contain import cpu_quota
from trainyard.backends.contain import ops as contain_ops
from trainyard.backends.contain.common import Needs, RankNeeds

KEY_PREFIX = "speed."  # not an attempt's key (j<job>.a<attempt>): the sweep of attempts leaves it be


@contextmanager
def check_cell(driver: Any, node: str, factor: float | None) -> Iterator[list[str]]:
    """The cgroup directories a check's process joins (writes its pid to `<dir>/cgroup.procs`)
    to run as `node`'s ranks do; [] where the containment has no cgroups.

    Raises:
        ContainmentError: the cell or its quota cannot be set up.
    """
    if driver.mode not in ("cgroup1", "cgroup2"):
        yield []
        return
    record = driver.prepare(Needs(key=f"{KEY_PREFIX}{node}", ranks=(RankNeeds(0, node),)))
    try:
        plan = record["ranks"]["0"]
        if factor is not None:
            cpu_quota.apply(plan, factor)
        yield list(plan.get("join") or [])
    finally:
        contain_ops.kill(record, timeout_s=5)
        contain_ops.remove(record)
