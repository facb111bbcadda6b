"""Helpers the baseline policies share: shape choice, a failure-caching placer, time estimates.

Nothing here is a policy. Everything is pure (no clock, no I/O) and iterates in a fixed order.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

from collections import defaultdict

from trainyard.sched.cluster import ClusterState, Placement
from trainyard.sched.placement import place
from trainyard.sched.types import JobClass, JobId, JobRequest, Reason, RunningJob, Snapshot

# A preempted job leaves min(grace, ~30 s) after its notice (the simulator's stop delay).
STOP_DELAY_S = 30.0
INF = math.inf


def shapes(req: JobRequest) -> tuple[int | None, ...]:
    """Node counts to try, largest first: an elastic job at max_nodes, else min_nodes."""
    if req.gpus_per_node is None:
        return (None,)
    if req.elastic:
        return (req.max_nodes, req.min_nodes)
    return (req.min_nodes,)


def shape_gpus(req: JobRequest, n: int | None) -> int:
    return req.gpus if n is None else req.gpus_per_node * n  # type: ignore[operator]


class Fitter:
    """`place` on one working state, remembering which request shapes already failed.

    Within a cycle the working state only loses capacity (`take`), and placement failure is
    monotone under allocation, so a shape that failed once keeps failing: thousands of waiting
    jobs of a few shapes cost a few `place` calls, not thousands.
    """

    __slots__ = ("state", "_failed")

    def __init__(self, state: ClusterState):
        self.state = state
        self._failed: dict[tuple[Any, ...], Reason] = {}

    def fit(
        self, req: JobRequest, allow: Callable[[int], bool] | None = None, elastic: bool = True
    ) -> tuple[Placement | None, Reason]:
        """The largest allowed shape that fits now; else None and why (QUOTA if `allow` said no)."""
        reason = Reason.QUOTA
        for n in shapes(req) if elastic else (shapes(req)[-1],):
            g = shape_gpus(req, n)
            if allow is not None and not allow(g):
                continue
            key = (req.pool, req.gpus_per_node, n, g, req.gpu_mem_mib, req.where)
            cached = self._failed.get(key)
            if cached is not None:
                reason = cached
                if reason is Reason.TOPOLOGY and req.gpu_mem_mib is None and self.state.free_gpus(req.pool) < g:
                    reason = Reason.CAPACITY
                continue
            p, why = place(self.state, req, n)
            if p is not None:
                return p, Reason.CAPACITY
            self._failed[key] = reason = why or Reason.CAPACITY
        return None, reason

    def take(self, p: Placement) -> None:
        self.state.allocate(p)

    def clip_to(self, ref: ClusterState, p: Placement) -> None:
        clip_to(self.state, ref, p)

    def forget(self) -> None:
        """Call after releasing capacity on the state (failures may no longer hold)."""
        self._failed.clear()


def clip_to(state: ClusterState, ref: ClusterState, p: Placement) -> None:
    """On the GPUs of `p`, allocate in `state` whatever it has free beyond what `ref` has free.

    Keeps the invariant "free in `state` implies free in `ref`" after `p` was allocated in `ref`
    (or in a state `ref` is kept below): used for claims, which are taken in full in the outlook
    but only as far as they are free in the live state, and for reservation masks.
    """
    nodes, mems = [], []
    for i, gis in p.nodes:
        free, rfree = state.free_mib[i], ref.free_mib[i]
        for g in gis:
            amt = free[g] - rfree[g]
            if amt > 0:
                nodes.append((i, (g,)))
                mems.append(amt)
    if nodes:
        state.allocate(Placement(nodes=tuple(nodes), mem_mib=tuple(mems)))


def fit_min(state: ClusterState, req: JobRequest) -> Placement | None:
    """`place` at the job's smallest shape, after cheap count checks that rule most cases out."""
    n = shapes(req)[-1]
    if req.gpu_mem_mib is None:
        pool = req.pool
        if state.free_gpus(pool) < shape_gpus(req, n):
            return None
        if n is not None and n > 1:
            buckets = state.buckets.get(pool)
            if buckets is None or sum(len(b) for b in buckets[req.gpus_per_node :]) < n:
                return None
    return place(state, req, n)[0]


def may_fit(state: ClusterState, req: JobRequest, n: int | None) -> bool:
    """False when `place(state, req, n)` surely fails, from the free-GPU buckets alone.

    For whole-GPU requests this is exact: a gang needs n nodes with `gpus_per_node` free each; a
    spread request needs its GPUs on its fewest possible nodes (the n fullest-free nodes of the
    pool must hold them). Shared (`gpu_mem_mib`) requests are left to `place` (True).
    """
    if req.gpu_mem_mib is not None:
        return True
    pool = req.pool
    b = state.buckets.get(pool)
    if b is None:
        return True  # let `place` say why
    if req.gpus_per_node is not None:
        gpn = req.gpus_per_node
        k = req.min_nodes if n is None else n
        if gpn >= len(b):
            return True  # let `place` say why (topology)
        if k == 1:
            return any(b[gpn:])
        return sum(len(x) for x in b[gpn:]) >= k
    need = req.gpus
    if state.pool_free.get(pool, 0) < need:
        return False
    left = -(-need // (len(b) - 1)) if len(b) > 1 else 1
    total = 0
    for free in range(len(b) - 1, 0, -1):
        c = len(b[free])
        if c:
            take = c if c < left else left
            total += take * free
            left -= take
            if left == 0:
                break
    return total >= need


def class_of(snap: Snapshot, name: str) -> JobClass:
    c = snap.classes.get(name)
    return c if c is not None else JobClass(name=name, priority=0)


class Classes(dict[str, JobClass]):
    """`class_of` for one cycle, memoized by class name (a cycle looks classes up per job)."""

    def __init__(self, snap: Snapshot):
        super().__init__()
        self.snap = snap
        self.prio: dict[str, int] = _Prio(self)

    def __missing__(self, name: str) -> JobClass:
        c = self[name] = class_of(self.snap, name)
        return c

    def may_preempt(self, r: RunningJob) -> bool:
        """`may_preempt`, with the class looked up here."""
        if r.preempting or r.starting:
            return False
        cls = self[r.req.job_class]
        return bool(cls.preemptible and self.snap.now - r.start_time >= cls.min_run_s)


class _Prio(dict[str, int]):
    __slots__ = ("classes",)

    def __init__(self, classes: Classes):
        super().__init__()
        self.classes = classes

    def __missing__(self, name: str) -> int:
        p: int = self.classes[name].priority
        self[name] = p
        return p


def team_usage(running: Iterable[RunningJob], skip_preempting: bool = False) -> list[tuple[str, str, int]]:
    """GPUs held per (team, pool), summed (in first-seen order): a short input for `QuotaLedger`."""
    use: dict[tuple[str, str], int] = {}
    for r in running:
        if skip_preempting and r.preempting:
            continue
        k = (r.req.team, r.req.pool)
        use[k] = use.get(k, 0) + r.placement.gpus
    return [(t, p, g) for (t, p), g in use.items()]


def remaining_s(req: JobRequest, progress_s: float, cls: JobClass) -> float:
    """Expected run time of the next/current attempt: the estimate, else the class limit, else inf."""
    if req.est_runtime_s is not None:
        return max(0.0, req.est_runtime_s - progress_s)
    if cls.max_run_s is not None:
        return cls.max_run_s
    return INF


def expected_end(snap: Snapshot, r: RunningJob) -> float:
    if r.preempting:
        return snap.now + STOP_DELAY_S
    end = r.start_time + remaining_s(r.req, r.progress_s, class_of(snap, r.req.job_class))
    return max(end, snap.now)


def may_preempt(snap: Snapshot, r: RunningJob) -> bool:
    """Preemptible class, past its min run time in this attempt, not already leaving nor still
    being launched."""
    if r.preempting or r.starting:
        return False
    cls = class_of(snap, r.req.job_class)
    return cls.preemptible and snap.now - r.start_time >= cls.min_run_s


def pools_of(state: ClusterState) -> list[str]:
    return sorted(state.max_gpus)


def fifo_key(req: JobRequest) -> tuple[float, JobId]:
    return (req.submit_time, req.id)


def released(state: ClusterState, placements: Iterable[Placement]) -> ClusterState:
    out = state.copy()
    for p in placements:
        out.release(p)
    return out


class Outlook:
    """The cluster as it will be once every job under notice has left: where preemptors wait.

    A policy that preempts must not start the preemptor in the same cycle (the victims keep their
    GPUs for their grace period). It *claims* the GPUs instead: the claim is allocated here, and
    the part of it that is free right now is also taken out of the live working state, so that
    lower-ranked jobs cannot grab it in the meantime. Next cycle the claim is simply recomputed
    from the snapshot; a preemptor whose victims are still leaving finds that it fits here without
    new victims, so nobody is preempted twice for the same job.

    Invariant: whatever is free in the live state is free here too.
    """

    __slots__ = ("state", "fitter", "ledger", "victims")

    def __init__(self, snap: Snapshot, with_quota: bool, usage: list[tuple[str, str, int]] | None = None):
        """`usage`: `team_usage(snap.running, skip_preempting=True)` if the caller has it."""
        from trainyard.sched.quota import QuotaLedger

        self.state = snap.cluster.copy()
        for r in snap.running:
            if r.preempting:
                self.state.release(r.placement)
        self.fitter = Fitter(self.state)
        self.ledger = (
            QuotaLedger(snap.teams, usage if usage is not None else team_usage(snap.running, skip_preempting=True))
            if with_quota
            else None
        )
        self.victims: dict[JobId, RunningJob] = {}

    def note_start(self, req: JobRequest, p: Placement) -> None:
        self.fitter.take(p)
        if self.ledger is not None:
            self.ledger.add(req.team, req.pool, p.gpus)

    def _release(self, victims: list[RunningJob], ledger: object = None) -> None:
        for v in victims:
            self.state.release(v.placement)
            if ledger is not None:
                ledger.add(v.req.team, v.req.pool, -v.gpus)  # type: ignore[attr-defined]

    def _restore(self, victims: list[RunningJob], ledger: object = None) -> None:
        for v in reversed(victims):
            self.state.allocate(v.placement)
            if ledger is not None:
                ledger.add(v.req.team, v.req.pool, v.gpus)  # type: ignore[attr-defined]

    def claim(
        self,
        req: JobRequest,
        candidates: Iterable[RunningJob],
        check: Callable[[ClusterState, object], Placement | None],
        accept: Callable[[RunningJob, object], bool] | None = None,
    ) -> tuple[list[RunningJob], Placement] | None:
        """Victims (possibly none) whose leaving lets `req` fit, and where it would go.

        Candidates are taken greedily in the given order until `check(state, ledger)` finds a
        placement; then, as Kueue does, each chosen victim but the last is put back (latest chosen
        first) if the job still fits without it. Commits nothing (the state is restored).
        """
        p = check(self.state, self.ledger)
        if p is not None:
            return [], p
        candidates = [c for c in candidates if c.req.id not in self.victims]
        if not candidates:
            return None
        ledger = self.ledger
        chosen: list[RunningJob] = []
        for c in candidates:
            if accept is not None and not accept(c, ledger):
                continue
            self._release([c], ledger)
            chosen.append(c)
            p = check(self.state, ledger)
            if p is not None:
                break
        if p is not None:
            for c in reversed(chosen[:-1]):
                self._restore([c], ledger)
                q = check(self.state, ledger)
                if q is not None:
                    p = q
                    chosen.remove(c)
                else:
                    self._release([c], ledger)
        self._restore(chosen, ledger)
        return None if p is None else (chosen, p)

    def claim_on_nodes(self, req: JobRequest, candidates: list[RunningJob]) -> tuple[list[RunningJob], Placement] | None:
        """Slurm-style victim choice: sweep the candidates in the given order (youngest first),
        counting what each would free on its nodes, until the job's number of nodes have room;
        only the victims on those nodes are taken. Verified with a real placement; commits
        nothing; ignores quota.
        """
        p = self.fit_min(req)
        if p is not None:
            return [], p
        if not candidates:
            return None
        taken = self.victims
        st = self.state
        pool = req.pool
        n = shapes(req)[-1]
        need = shape_gpus(req, n)
        max_node = st.max_gpus.get(pool, 0)
        if max_node == 0:
            return None
        k = -(-need // max_node) if n is None else n
        per = -(-need // k) if n is None or req.gpus_per_node is None else req.gpus_per_node
        mem = req.gpu_mem_mib
        done: list[int] = []
        if mem is None and k > 1:
            done = sorted(i for b in st.buckets[pool][per:] for i in b)[: k - 1]
        done_set = set(done)
        have: dict[int, int] = {}
        acc: dict[int, list[RunningJob]] = defaultdict(list)
        nodes = st.nodes
        for c in candidates:
            if c.req.id in taken:
                continue
            for i, gis in c.placement.nodes:
                if i in done_set or nodes[i].pool != pool or not nodes[i].healthy:
                    continue
                h = have.get(i)
                if h is None:
                    h = st.free_whole[i] if mem is None else st.usable_on_node(i, mem)
                h += len(gis)
                have[i] = h
                acc[i].append(c)
                if h >= per:
                    done.append(i)
                    done_set.add(i)
            if len(done) >= k:
                break
        if len(done) < k:
            return None
        victims: list[RunningJob] = []
        seen: set[JobId] = set()
        for i in done[:k]:
            for v in acc.get(i, ()):
                if v.req.id not in seen:
                    seen.add(v.req.id)
                    victims.append(v)
        self._release(victims)
        p = fit_min(st, req)
        self._restore(victims)
        return None if p is None else (victims, p)

    def fit_min(self, req: JobRequest) -> Placement | None:
        return self.fitter.fit(req, elastic=False)[0]

    def commit(self, req: JobRequest, victims: list[RunningJob], p: Placement, live: ClusterState) -> None:
        self._release(victims, self.ledger)
        for v in victims:
            self.victims[v.req.id] = v
        if victims:
            self.fitter.forget()  # capacity came back: cached failures may no longer hold
        self.note_start(req, p)
        clip_to(live, self.state, p)
