"""The environment check of a bare gang at start (issue 37, "uniform environment for bare jobs").

Each node's fingerprint (`backends.environment`: Python, PyTorch, CUDA, NCCL, driver) is asked of
the backend (`Backend.node_environment`) and kept for `TTL_S`; a stale one is asked again in the
background while the old answer serves. Before a bare job's ranks start on more than one node,
`check` compares its nodes: with `images.fingerprint: refuse` a difference fails the attempt at
start with a message naming the node and what differs; with `warn` it is an event and a log line
and the job runs; `off` asks nothing. A job with an image runs one digest everywhere and is not
checked. A node that cannot tell (no interpreter, a timeout) is left out of the comparison.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from typing import TYPE_CHECKING

from trainyard.backends.base import Backend, LaunchSpec
from trainyard.backends.environment import differences
from trainyard.services import transitions
from trainyard.services.events import record
from trainyard.states import AttemptOutcome, JobState
from trainyard.store.models import JobRow

if TYPE_CHECKING:
    from trainyard.control.loop.context import LoopContext

log = logging.getLogger("trainyard.loop")

TTL_S = 600.0


class Fingerprints:
    """Per-node fingerprints, asked of the backend at most once per `ttl_s` (then refreshed off
    the caller's thread)."""

    def __init__(self, backend: Backend, ttl_s: float = TTL_S) -> None:
        self._backend = backend
        self._ttl = ttl_s
        self._lock = threading.Lock()
        self._known: dict[str, tuple[float, dict[str, str]]] = {}
        self._asking: dict[str, threading.Event] = {}  # node → set when its answer is in

    def of(self, nodes: Sequence[str]) -> dict[str, dict[str, str]]:
        """Each node's fingerprint: a fresh one from the cache, a stale one (refreshed in the
        background), or, never asked yet, asked now (all such nodes at once; one already being
        asked, by `prime` say, is waited for, not asked twice)."""
        now = time.monotonic()
        waits = []
        with self._lock:
            for n in nodes:
                hit = self._known.get(n)
                if hit is None:
                    waits.append(self._ask_locked(n))
                elif now - hit[0] > self._ttl:
                    self._ask_locked(n)
        for done in waits:
            done.wait()
        with self._lock:
            return {n: self._known[n][1] for n in nodes if n in self._known}

    def prime(self, nodes: Sequence[str]) -> None:
        """Ask every node not known yet, in the background (at the loop's start)."""
        with self._lock:
            for n in nodes:
                if n not in self._known:
                    self._ask_locked(n)

    def forget(self, node: str | None = None) -> None:
        """Ask again next time (a node's software changed; `None`: every node)."""
        with self._lock:
            if node is None:
                self._known.clear()
            else:
                self._known.pop(node, None)

    def _ask_locked(self, node: str) -> threading.Event:
        """The event of `node`'s ask under way, or of a new one started on a thread (lock held)."""
        done = self._asking.get(node)
        if done is None:
            done = self._asking[node] = threading.Event()
            threading.Thread(target=self._ask, args=(node, done), daemon=True, name="trainyard-fp").start()
        return done

    def _ask(self, node: str, done: threading.Event) -> None:
        try:
            fp = self._backend.node_environment(node)
        except Exception as e:  # a backend that cannot tell must not break a start
            fp = {"error": str(e)[:200]}
        with self._lock:
            self._known[node] = (time.monotonic(), fp)
            del self._asking[node]
        done.set()


def check(fps: Fingerprints, nodes: Sequence[str]) -> list[str]:
    """The differences between the nodes' environments (`backends.environment.differences`), in
    node order; [] when one node, or all alike."""
    unique = list(dict.fromkeys(nodes))
    if len(unique) < 2:
        return []
    return differences(fps.of(unique))


MISMATCH = "EnvironmentMismatch"


def enforce(ctx: LoopContext, spec: LaunchSpec, policy: str) -> bool:
    """Before a bare gang's launch: False when the attempt was failed here (`refuse` and the
    nodes differ); True to launch (alike, `warn`, `off`, one node, or a job with an image)."""
    if policy == "off" or spec.container is not None or ctx.fingerprints is None:
        return True
    diffs = check(ctx.fingerprints, [r.node for r in sorted(spec.ranks, key=lambda r: r.rank)])
    if not diffs:
        return True
    text = "; ".join(diffs)
    now = ctx.clock()
    with ctx.lock, ctx.store.session.begin() as s:
        j = s.get(JobRow, spec.job_id)
        if j is None or j.attempt != spec.attempt:
            return False
        if policy == "warn":
            log.warning("job %s: nodes differ: %s", spec.job_id, text)
            record(s, "scheduler", "job.environment_differs", f"attempt {spec.attempt}: nodes differ: {text}",
                   job_id=j.id, at=now, data={"differences": diffs})
            return True
        why = f"{MISMATCH}: the job's nodes differ: {text}"[:200]
        transitions.end_attempt(s, j, AttemptOutcome.FAILED, why, now, cause="env_mismatch")
        transitions.finish(j, JobState.FAILED, why, now)
        record(s, "scheduler", "job.failed", f"attempt {spec.attempt} not started: the job's nodes differ: {text} "
               "(images.fingerprint: refuse; run it in an image, or on alike nodes)", job_id=j.id, at=now,
               data={"differences": diffs})
    return False
