"""Remediation rounds for a node its checks took down: the configured actions (reboot, reimage,
replace, …) run in order, each a command with a time-out, in a thread per round.

The control loop owns the state machine (`ControlLoop._remediate`: down → remediating → down,
checked again → up; cooldown; a cap; an alert): this module only runs the actions and keeps count.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from trainyard.control.health.checks import operator_env
from trainyard.spec.models import ActionSpec, RemediationSpec


@dataclass
class _Round:
    attempts: int = 0  # remediation rounds started since the node last went down
    running: bool = False
    last_end: float | None = None
    finished: list[tuple[str, bool, str]] | None = None  # (action, ok, message) of a round not yet reported
    alerted: bool = False


class Remediator:
    """Runs a node's remediation actions (reboot, reimage, …) in a thread per round.

    The control loop decides when (`may_start`: not running, rounds left, cooldown over) and
    reads the outcome (`take_finished`); the node's state and events are the loop's. Rounds are
    counted in memory: a control plane restart gives a down node its attempts again.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._nodes: dict[str, _Round] = {}
        self._lock = threading.Lock()

    def state(self, node: str) -> _Round:
        with self._lock:
            return self._nodes.setdefault(node, _Round())

    def may_start(self, node: str, spec: RemediationSpec, now: float) -> bool:
        r = self.state(node)
        if r.running or r.attempts >= spec.max_attempts:
            return False
        return r.last_end is None or now - r.last_end >= spec.cooldown

    def exhausted(self, node: str, spec: RemediationSpec) -> bool:
        r = self.state(node)
        return not r.running and r.attempts >= spec.max_attempts

    def start(self, node: str, spec: RemediationSpec) -> int:
        """Start a round in the background; returns its number (1, 2, …)."""
        r = self.state(node)
        r.attempts += 1
        r.running = True
        threading.Thread(target=self._round, args=(node, list(spec.actions), r), name=f"trainyard-remedy-{node}",
                         daemon=True).start()
        return r.attempts

    def _round(self, node: str, actions: list[ActionSpec], r: _Round) -> None:
        out: list[tuple[str, bool, str]] = []
        env = operator_env(TRAINYARD_NODE=node, TRAINYARD_DATA_DIR=str(self.data_dir))  # no credential of the plane's
        for a in actions:
            try:
                p = subprocess.run(a.command, env=env, capture_output=True, text=True, timeout=a.timeout,
                                   stdin=subprocess.DEVNULL)
                first = (p.stdout.strip() or p.stderr.strip()).splitlines()[:1]
                out.append((a.name, p.returncode == 0, first[0][:200] if first else f"exit {p.returncode}"))
            except subprocess.TimeoutExpired:
                out.append((a.name, False, f"timed out after {a.timeout:g}s"))
            except OSError as e:
                out.append((a.name, False, f"cannot run {a.command[0]}: {e.strerror}"))
            if not out[-1][1]:
                break  # the next action assumes this one worked
        with self._lock:
            r.running, r.last_end, r.finished = False, time.time(), out

    def take_finished(self, node: str) -> list[tuple[str, bool, str]] | None:
        with self._lock:
            r = self._nodes.get(node)
            if r is None or r.finished is None:
                return None
            done, r.finished = r.finished, None
            return done

    def reset(self, node: str) -> None:
        """The node is back in service (or an operator took it over): its rounds start afresh."""
        with self._lock:
            r = self._nodes.get(node)
            if r is not None and not r.running:
                del self._nodes[node]
