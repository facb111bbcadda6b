"""Ranks that are alive but make no progress (stopped: SIGSTOP, a frozen node), across passes.

A rank the backend reports `stopped` for `hung_after_s` makes its job hung (the node-health step
stops it to resume from its checkpoint). Which ranks were seen frozen is kept until the attempt
ends, so that the reconcile step can point at their nodes as suspects.
"""

from __future__ import annotations

from trainyard.backends.base import AttemptState

Key = tuple[int, int]  # (job id, attempt)


class FrozenRanks:
    def __init__(self, hung_after_s: float) -> None:
        self.hung_after_s = hung_after_s
        self._since: dict[Key, float] = {}
        self._seen: dict[Key, set[int]] = {}  # ranks seen frozen, per attempt

    def observe(self, attempts: list[AttemptState], now: float) -> set[Key]:
        """Note this pass's frozen ranks; returns the attempts with a rank stopped for at least
        `hung_after_s` (an attempt whose ranks run again starts counting afresh)."""
        since: dict[Key, float] = {}
        for a in attempts:
            frozen = {r.rank for r in a.ranks if r.running and r.stopped}
            if frozen:
                key = (a.job_id, a.attempt)
                since[key] = self._since.get(key, now)
                self._seen.setdefault(key, set()).update(frozen)
        self._since = since
        return {k for k, t in since.items() if now - t >= self.hung_after_s}

    def pop_seen(self, job_id: int, attempt: int) -> set[int]:
        """The ranks of an ended attempt that were ever seen frozen (and forget them)."""
        return self._seen.pop((job_id, attempt), set())
