"""Quota accounting with cohorts: nominal quota, borrowing and lending limits (Kueue's model).

A team may always use its nominal quota. Beyond it, it borrows: the GPUs it uses above nominal
must be covered by unused nominal quota that other teams of its cohort lend (each lends at most
its `lending_limit` of what it leaves unused), and its borrowed amount may not exceed its own
`borrowing_limit`. A team without a cohort never borrows.

`QuotaLedger` is built per cycle from the running jobs and updated as the cycle admits or
preempts; it is cheap (dict arithmetic) so every candidate job can be checked.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Mapping

from trainyard.sched.types import Team


class QuotaLedger:
    __slots__ = ("teams", "usage", "_cohort_of", "_members", "_nominal", "_slack")

    def __init__(self, teams: Mapping[str, Team], usage: Iterable[tuple[str, str, int]] = ()):
        self.teams = teams
        self.usage: dict[tuple[str, str], int] = defaultdict(int)
        self._cohort_of = {name: t.cohort for name, t in teams.items()}
        self._members: dict[str, list[str]] = defaultdict(list)
        self._nominal: dict[tuple[str, str], int] = {}
        self._slack: dict[tuple[str, str, str | None], int] = {}  # cleared on every change
        for name, t in teams.items():
            if t.cohort:
                self._members[t.cohort].append(name)
        for team, pool, gpus in usage:
            self.usage[(team, pool)] += gpus

    def copy(self) -> "QuotaLedger":
        new = object.__new__(QuotaLedger)
        new.teams = self.teams
        new.usage = defaultdict(int, self.usage)
        new._cohort_of = self._cohort_of
        new._members = self._members
        new._nominal = self._nominal
        new._slack = {}
        return new

    def add(self, team: str, pool: str, gpus: int) -> None:
        self.usage[(team, pool)] += gpus
        self._slack.clear()

    def nominal(self, team: str, pool: str) -> int:
        key = (team, pool)
        n = self._nominal.get(key)
        if n is None:
            t = self.teams.get(team)
            n = self._nominal[key] = t.quota(pool).nominal if t else 0
        return n

    def used(self, team: str, pool: str) -> int:
        return self.usage.get((team, pool), 0)

    def borrowed(self, team: str, pool: str) -> int:
        b = self.usage.get((team, pool), 0) - self.nominal(team, pool)
        return b if b > 0 else 0

    def headroom_in_nominal(self, team: str, pool: str) -> int:
        return max(0, self.nominal(team, pool) - self.used(team, pool))

    def _lendable(self, team: str, pool: str) -> int:
        q = self.teams[team].quota(pool)
        unused = max(0, q.nominal - self.used(team, pool))
        return unused if q.lending_limit is None else min(unused, q.lending_limit)

    def cohort_slack(self, cohort: str, pool: str, exclude: str | None = None) -> int:
        """GPUs the cohort can still lend: lendable nominal minus what members already borrow."""
        key = (cohort, pool, exclude)
        cached = self._slack.get(key)
        if cached is not None:
            return cached
        lend = borrow = 0
        for m in self._members.get(cohort, ()):
            if m == exclude:
                continue
            lend += self._lendable(m, pool)
            borrow += self.borrowed(m, pool)
        self._slack[key] = lend - borrow
        return lend - borrow

    def fits(self, team: str, pool: str, gpus: int) -> bool:
        """May `team` start `gpus` more GPUs in `pool` without breaking any quota rule?"""
        t = self.teams.get(team)
        if t is None:
            return False
        q = t.quota(pool)
        after = self.used(team, pool) + gpus
        if after <= q.nominal:
            return True
        borrow_after = after - q.nominal
        if q.borrowing_limit is not None and borrow_after > q.borrowing_limit:
            return False
        if not t.cohort:
            return False
        return borrow_after <= self.cohort_slack(t.cohort, pool, exclude=team)

    def borrowing_teams(self, pool: str) -> list[str]:
        return [t for (t, p), u in self.usage.items() if p == pool and u > self.nominal(t, pool)]
