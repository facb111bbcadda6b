"""Each team's decayed GPU-seconds (fair share's usage), kept up to date instead of recomputed.

`snapshot.decayed_usage` weighs every GPU-second by 2^(-age / half-life). Recomputing it every
pass meant reading six half-lives (six weeks) of attempts on every control-loop pass: ~70,000 rows
a pass on a cluster that runs 100,000 jobs in two months, most of a pass's one-second budget.

The decayed sum factors: an attempt on g GPUs over [a, b) adds g * (e^{λb} - e^{λa}) / λ * e^{-λ·now},
so the finished attempts' part is one number per team, `e^{-λ·now}` times a sum that only grows as
attempts end (times are taken relative to an anchor, moved forward now and then so the exponentials
stay small). Each pass reads only the attempts that ended since the last one (by the `ended_at`
index, with a minute of overlap, deduplicated by attempt id, so an end committed a little late
still counts once) and the attempts still running. The first pass reads the six half-lives once.
"""

from __future__ import annotations

import math

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.control.loop.snapshot import USAGE_HALF_LIFE_S
from trainyard.store.models import AttemptRow, JobRow

# An attempt whose end is committed up to this long after its `ended_at` is still counted.
LATE_COMMIT_S = 60.0
# Move the anchor after this many half-lives: e^{λ·(t - anchor)} stays below 2^20.
REANCHOR_HALF_LIVES = 20.0


class DecayedUsage:
    """Per team, the decayed GPU-seconds of every attempt, finished ones kept as running sums."""

    def __init__(self, half_life_s: float = USAGE_HALF_LIFE_S) -> None:
        self.half_life_s = half_life_s
        self.lam = math.log(2) / half_life_s
        self.anchor: float | None = None
        self.finished: dict[str, float] = {}  # sum of g * (e^{λ(b-anchor)} - e^{λ(a-anchor)}) / λ
        self.seen_until: float | None = None  # ended_at up to which finished attempts are counted
        self.recent: dict[int, float] = {}  # attempt id -> ended_at, within LATE_COMMIT_S of seen_until

    def __call__(self, s: Session, now: float) -> dict[str, float]:
        """Each team's decayed GPU-seconds at `now`: what `snapshot.decayed_usage` gives over the
        attempts of the last six half-lives, without reading them all again."""
        if self.anchor is None or now - self.anchor > REANCHOR_HALF_LIVES * self.half_life_s:
            self._reset(now)
        since = now - 6 * self.half_life_s if self.seen_until is None else self.seen_until - LATE_COMMIT_S
        a, j = AttemptRow, JobRow
        ended = s.execute(select(a.id, j.team, a.gpus, a.started_at, a.ended_at).join(j, j.id == a.job_id)
                          .where(a.ended_at > since)).all()
        for aid, team, gpus, start, end in ended:
            if aid in self.recent or end is None or end > now:  # (None: never, ended_at > since)
                continue  # counted already; or ended "after now" (a clock step): counted when now passes it
            self.recent[aid] = end
            self._add(self.finished, team, gpus, start, end)
            if self.seen_until is None or end > self.seen_until:
                self.seen_until = end
        if self.seen_until is None:
            self.seen_until = now
        self.recent = {k: e for k, e in self.recent.items() if e > self.seen_until - LATE_COMMIT_S}
        out = dict(self.finished)
        running = s.execute(select(j.team, a.gpus, a.started_at).join(j, j.id == a.job_id)
                            .where(a.ended_at.is_(None))).all()
        for team, gpus, start in running:
            self._add(out, team, gpus, start, now)
        scale = math.exp(-self.lam * (now - self.anchor))  # type: ignore[operator]
        return {t: v * scale for t, v in out.items() if v > 0}

    def _add(self, into: dict[str, float], team: str, gpus: int | None, start: float, end: float) -> None:
        if not gpus or end <= start:
            return
        lam, anchor = self.lam, self.anchor
        w = (math.exp(lam * (end - anchor)) - math.exp(lam * (start - anchor))) / lam  # type: ignore[operator]
        into[team] = into.get(team, 0.0) + gpus * w

    def _reset(self, now: float) -> None:
        """Start over, anchored at `now`: the next call reads the six half-lives again."""
        self.anchor, self.finished, self.seen_until, self.recent = now, {}, None, {}
