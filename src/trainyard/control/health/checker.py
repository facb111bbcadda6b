"""Rounds of checks per node: periodic ones in a thread of their own, and before-work ones on
request, in a small pool, so that neither a slow check nor a hung one ever stalls the control loop.

A *round* runs a node's checks one after the other; its results replace the node's previous
ones check by check. A periodic round runs the checks marked `when: always`; a before-work round
runs all of them (also `when: before_work`). At most one round per node runs at a time: a request
for a node whose round is running or queued is that round.

`fresh(node, spec, since)` is the before-work test the loop applies: every configured check has
a result from a run that started at or after `since`.

Each node runs its own checks (`node_spec_of(node)`: the pilot's trial on a pilot node,
spec/pilot.py); the periodic rounds come every `interval`, the shortest any node's settings give.
A node's results are only those of the checks it runs now: a check taken out of its settings (a
trial rolled back) is forgotten at once, not at its next round.
"""

from __future__ import annotations

import logging
import queue
import threading
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Callable

from trainyard.control.health.checks import BEFORE_WORK, PERIODIC, CheckResult, run_check
from trainyard.control.lifecycle.supervise import Supervised
from trainyard.spec.models import HealthSpec

log = logging.getLogger("trainyard.health")

BEFORE_WORK_WORKERS = 8  # before-work rounds running at once (the others queue)


class HealthChecker:
    """Runs the configured checks on every node every `interval`, and on request.

    `results(node)` gives the newest result of each check; `request(node)` queues a before-work
    round and returns at once; `on_round(node, context)` is called after each round (the loop
    wakes on it, so a node that just passed takes work without waiting for the next tick).
    """

    def __init__(self, data_dir: Path, spec_of: Callable[[], HealthSpec], nodes_of: Callable[[], list[str]],
                 on_round: Callable[[str, str], None] | None = None,
                 model_of: Callable[[str], str | None] | None = None,
                 cell_of: Callable[[str], AbstractContextManager[list[str]]] | None = None,
                 node_spec_of: Callable[[str], HealthSpec] | None = None):
        self.data_dir = data_dir
        self.spec_of = spec_of  # the configuration's own health settings
        self.node_spec_of = node_spec_of or (lambda node: self.spec_of())  # a node's (spec/pilot.py)
        self.nodes_of = nodes_of
        self.on_round = on_round
        self.model_of = model_of or (lambda node: None)  # a node's gpu_model: the `speed` check's baseline
        self.cell_of = cell_of  # the backend's `check_cell`: where a node's `speed` check measures
        self._results: dict[str, dict[str, CheckResult]] = {}
        self._busy: set[str] = set()  # nodes whose round is running
        self._queued: set[str] = set()  # nodes with a before-work round waiting for a worker
        self._since: dict[str, float] = {}  # findings before this are forgotten (see `forget_before`)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.thread: Supervised | None = None  # the periodic rounds
        self._requests: queue.Queue[str] = queue.Queue()
        self._workers: list[threading.Thread] = []  # daemons: a hung check must not hold up the exit

    def start(self, on_death: Callable[[str, BaseException], None] | None = None) -> None:
        """The periodic rounds, on a supervised thread (control/lifecycle/supervise.py): a round that raises
        (the configuration unreadable, a bug) restarts the thread, and `on_death` is told."""
        self.thread = Supervised("trainyard-health", self._run, self._stop, on_death)
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        for _ in self._workers:
            self._requests.put("")  # wakes a worker to see the stop
        if self.thread is not None:
            self.thread.join(timeout=5)

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            interval = self.spec_of().interval
            for node in self.nodes_of():
                if self._stop.is_set():
                    return
                spec = self.node_spec_of(node)
                interval = min(interval, spec.interval)
                if spec.checks:
                    self.run_now(node, spec)
            self._stop.wait(interval)

    def run_now(self, node: str, spec: HealthSpec | None = None, context: str = PERIODIC) -> list[CheckResult] | None:
        """One round on `node` in this thread; None (and nothing run) if one is running already."""
        spec = spec or self.node_spec_of(node)
        checks = [c for c in spec.checks if context == BEFORE_WORK or c.when == "always"]
        with self._lock:
            if node in self._busy:
                return None
            self._busy.add(node)
            since = self._since.get(node, 0.0)
        out: list[CheckResult] = []
        try:
            for c in checks:
                out.append(run_check(c, node, self.data_dir, since=since, context=context,
                                     gpu_model=self.model_of(node) if c.kind == "speed" else None,
                                     cell=self.cell_of))
        finally:
            with self._lock:
                self._busy.discard(node)
                names = {c.name for c in spec.checks}  # a check taken out of the configuration goes
                merged = {k: r for k, r in self._results.get(node, {}).items() if k in names}
                merged.update({r.check: r for r in out})
                self._results[node] = merged
        if self.on_round is not None:
            self.on_round(node, context)
        return out

    def request(self, node: str) -> bool:
        """Queue a before-work round on `node` unless one is running or queued; never waits."""
        with self._lock:
            if node in self._busy or node in self._queued or self._stop.is_set():
                return False
            self._queued.add(node)
            if len(self._workers) < min(BEFORE_WORK_WORKERS, len(self._queued) + len(self._busy)):
                t = threading.Thread(target=self._work, name=f"trainyard-health-work-{len(self._workers)}", daemon=True)
                self._workers.append(t)
                t.start()
        self._requests.put(node)
        return True

    def _work(self) -> None:
        while not self._stop.is_set():
            node = self._requests.get()
            if not node or self._stop.is_set():
                continue
            with self._lock:
                self._queued.discard(node)
            try:
                self.run_now(node, context=BEFORE_WORK)
            except Exception:  # noqa: BLE001 - run_check never raises; a failing spec_of must not kill the worker
                log.exception("before-work round on %s failed", node)

    def pending(self, node: str) -> bool:
        """A round on `node` is running or queued."""
        with self._lock:
            return node in self._busy or node in self._queued

    def results(self, node: str, spec: HealthSpec | None = None) -> list[CheckResult]:
        """The newest result of each check the node runs now (module docstring); `spec`: its
        settings where the caller has them (the loop's steps: the version of their pass)."""
        names = {c.name for c in (spec or self.node_spec_of(node)).checks}
        with self._lock:
            return [r for k, r in self._results.get(node, {}).items() if k in names]

    def fresh(self, node: str, spec: HealthSpec, since: float) -> bool:
        """Every check in `spec` has a result on `node` from a run started at or after `since`."""
        with self._lock:
            have = self._results.get(node, {})
            return all(c.name in have and have[c.name].at >= since for c in spec.checks)

    def forget_before(self, node: str, at: float) -> None:
        """The node was remediated or resumed by a person at `at`: stateful checks (the XID events
        `nvml` remembers) forget what they saw before."""
        with self._lock:
            if at > self._since.get(node, 0.0):
                self._since[node] = at
