"""Which of a job's checkpoints stay in the fast tier, which belong in the archive, which go:
a pure function of the committed steps, the marks and the rules (spec/lifecycle.py says the rules).

The plane applies the plan (`control/lifecycle/checkpoint_tiers.py`): a step in `archive` that is
not yet archived is copied, verified, and only then removed from the fast tier; a step in `delete`
is removed from every tier, each removal an audit event. The newest committed step is never in
`delete` or moved out of the fast tier while the job may still resume from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainyard.spec.lifecycle import DEFAULT_KEEP_LAST, CheckpointRules

FAST = "fast"
ARCHIVE = "archive"


@dataclass(frozen=True)
class Checkpoint:
    """One committed step as the plane knows it: where copies are, its manifest's metrics, its mark."""

    step: int
    tiers: frozenset[str]
    metrics: dict[str, float] | None = None
    keep: bool = False


@dataclass(frozen=True)
class Plan:
    fast: frozenset[int]  # stay (or are fetched back) in the fast tier
    archive: frozenset[int]  # belong in the archive tier (moved there when not yet)
    delete: frozenset[int]  # removed from every tier

    def moves(self, cps: list[Checkpoint]) -> list[int]:
        """Steps to copy to the archive now, oldest first."""
        return sorted(c.step for c in cps if c.step in self.archive and ARCHIVE not in c.tiers)

    def fast_removals(self, cps: list[Checkpoint]) -> list[int]:
        """Steps whose fast copy may go because a verified archive copy exists."""
        return sorted(c.step for c in cps if c.step in self.archive and c.step not in self.fast
                      and FAST in c.tiers and ARCHIVE in c.tiers)


def plan(cps: list[Checkpoint], rules: CheckpointRules, *, archive_tier: bool, ended_at: float | None,
         now: float) -> Plan:
    """The plan for one job's committed checkpoints `cps` under `rules`.

    `archive_tier`: whether an archive is configured (without one, what would be archived stays
    fast). `ended_at`: when the job ended (None: it may still run); `keep_for` counts from then.
    """
    steps = sorted(c.step for c in cps)
    if not steps:
        return Plan(frozenset(), frozenset(), frozenset())
    marked = {c.step for c in cps if c.keep}
    if rules.keep_for is not None and ended_at is not None and now >= ended_at + rules.keep_for:
        return Plan(frozenset(marked), frozenset(), frozenset(s for s in steps if s not in marked))
    keep_last = rules.keep_last or DEFAULT_KEEP_LAST
    fast = set(steps[-keep_last:]) | marked
    older = [s for s in steps if s not in fast]
    selected: set[int] = set()
    if rules.keep_every is None and rules.keep_best is None:
        selected = set(older)
    else:
        if rules.keep_every is not None:
            selected |= {s for s in older if s % rules.keep_every == 0}
        if rules.keep_best is not None:
            selected |= _best(cps, rules)
            selected &= set(older) | fast
            selected -= fast
    if archive_tier:
        return Plan(frozenset(fast), frozenset(selected), frozenset(s for s in older if s not in selected))
    return Plan(frozenset(fast | selected), frozenset(), frozenset(s for s in older if s not in selected))


def _best(cps: list[Checkpoint], rules: CheckpointRules) -> set[int]:
    """The `count` steps with the best value of the metric (steps without it never count)."""
    best = rules.keep_best
    assert best is not None
    scored = [(c.metrics[best.metric], c.step) for c in cps
              if c.metrics and isinstance(c.metrics.get(best.metric), (int, float))
              and math.isfinite(c.metrics[best.metric])]
    scored.sort(key=lambda t: (t[0] if best.mode == "min" else -t[0], -t[1]))
    return {step for _, step in scored[:best.count]}
