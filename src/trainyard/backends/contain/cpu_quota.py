"""A rank's CPU bandwidth slowed by a factor: the quota writer behind `yard chaos slow-node`.

Why a quota: a node that makes every gang on it slow (a throttled CPU, a bad fan) is what the
straggler detection must catch, and the CFS bandwidth limit of the rank's cell is the one knob
that slows every process of the rank alike, also ones started later, without touching the job.

The rank gets `cpus / factor` CPUs, where `cpus` is its --cpus-per-task (`cpus` in its plan),
or 1 for a rank without one: an emulated rank is one training process driving one GPU, so its
unslowed speed is one CPU's (a rank that keeps several CPUs busy without --cpus-per-task is slowed
by more than the factor; give it --cpus-per-task to slow it by exactly that). Restoring writes
the rank's own limit back (or none). cgroup v1: `cpu.cfs_quota_us` over `cpu.cfs_period_us` of
the rank's cpu directory; v2: `cpu.max` of the rank's directory, the `cpu` controller enabled
down to it first. The subreaper mode has no quota, so it cannot slow a rank (`ContainmentError`).

A quota is a cap, not a share: on a machine so busy that an unslowed rank already gets less than
1/F of a CPU, the cap changes nothing (measured on the loaded 2-core dev machine: F=2 left the
slowed rank at its unslowed peer's 0.3 CPU, while F=4 and F=8 held it at 1/F against 0.75-0.9 CPU).
Choose F so that 1/F CPU is below what a rank gets; on a real node, where each rank has its cores,
the slowed rank runs at 1/F of its speed.
"""

from __future__ import annotations

import os

from trainyard.backends.contain import cgroupfs
from trainyard.backends.contain.common import ContainmentError

PERIOD_US = 100_000
MIN_QUOTA_US = 1_000  # the kernel's floor for cfs_quota_us
MAX_FACTOR = 100.0  # beyond this the rank barely runs (1 ms of CPU per 100 ms)


def check_factor(factor: float) -> None:
    """Raises ValueError unless 1 < factor <= MAX_FACTOR (the message names the bounds)."""
    if not (factor == factor and 1.0 < factor <= MAX_FACTOR):  # factor == factor: not NaN
        raise ValueError(f"must be > 1 and <= {MAX_FACTOR:g} (2.0 = half speed), got {factor:g}")


def why_not(driver: object) -> str | None:
    """Why a containment driver (`contain.choose`'s) cannot slow ranks; None when it can."""
    mode = str(getattr(driver, "mode", ""))
    if mode == "cgroup1" and "cpu" not in getattr(driver, "base", {}):
        return "cgroup1's cpu hierarchy is not usable here"
    if mode == "cgroup2" and "cpu" not in getattr(driver, "controllers", set()):
        return "cgroup2's cpu controller is not delegated to the plane's cgroup"
    if mode not in ("cgroup1", "cgroup2"):
        return f"the {mode or 'process-group'} containment has no CPU quota"
    return None


def quota_us(cpus: int | None, factor: float | None) -> int | None:
    """The rank's quota per PERIOD_US: its own CPUs (None: no limit) divided by `factor`
    (None: not slowed); None means no limit at all."""
    if factor is None:
        return cpus * PERIOD_US if cpus else None
    return max(MIN_QUOTA_US, int((cpus or 1) * PERIOD_US / factor))


def apply(plan: dict, factor: float | None) -> None:
    """Set the rank's CPU bandwidth for `factor` (None: restore its own limit). `plan`: the rank's
    record in attempt.json's `contain`. A rank whose cgroup is gone (it ended, was released) is fine,
    and so is restoring a cell that has no quota.

    Raises:
        ContainmentError: the cell has no CPU quota (subreaper mode, no cpu hierarchy or controller).
    """
    mode = plan.get("mode")
    if mode not in ("cgroup1", "cgroup2") and factor is None:
        return  # nothing was slowed, nothing to restore
    q = quota_us(plan.get("cpus"), factor)
    if mode == "cgroup1":
        d = next((j for j in plan.get("join") or [] if os.path.exists(os.path.join(j, "cpu.cfs_quota_us"))), None)
        if d is None:
            if factor is None or not os.path.isdir(str(plan.get("freezer"))):
                return  # nothing to restore, or the rank's cgroups are gone
            raise ContainmentError("slowing a rank needs cgroup v1's cpu hierarchy, which this rank's cell lacks")
        _write(os.path.join(d, "cpu.cfs_period_us"), str(PERIOD_US))
        _write(os.path.join(d, "cpu.cfs_quota_us"), str(q if q is not None else -1))
    elif mode == "cgroup2":
        d = str(plan.get("freezer"))
        if not os.path.isdir(d):
            return
        if not os.path.exists(os.path.join(d, "cpu.max")):
            if factor is None:
                return  # no cpu controller here: nothing was slowed, nothing to restore
            _enable_cpu(d)
        _write(os.path.join(d, "cpu.max"), f"{q if q is not None else 'max'} {PERIOD_US}")
    else:
        raise ContainmentError(f"the {mode or 'process-group'} mode has no CPU quota, so it cannot slow a rank: "
                               "run the plane with cgroup containment (TRAINYARD_CONTAINMENT=cgroup1 or cgroup2)")


def _write(path: str, text: str) -> None:
    try:
        cgroupfs.write(path, text)
    except FileNotFoundError:
        return  # the rank's cgroup was removed meanwhile
    except OSError as e:
        raise ContainmentError(f"cannot set the CPU quota in {path}: {e.strerror}") from e


def _enable_cpu(rank_dir: str) -> None:
    """cgroup v2: enable `cpu` in cgroup.subtree_control from the nearest ancestor that hands it
    down to the rank's parent (the node level holds no process, so it may)."""
    chain = []
    d = os.path.dirname(rank_dir)
    while True:
        ctl = os.path.join(d, "cgroup.subtree_control")
        if not os.path.exists(ctl):
            raise ContainmentError(f"slowing a rank needs cgroup v2's cpu controller, not delegated above {rank_dir}")
        if "cpu" in cgroupfs.read(ctl).split():
            break
        chain.append(ctl)
        parent = os.path.dirname(d)
        if parent == d:
            raise ContainmentError(f"slowing a rank needs cgroup v2's cpu controller, not delegated above {rank_dir}")
        d = parent
    for ctl in reversed(chain):
        _write(ctl, "+cpu")
