"""Preemption by checkpoint: a notice sets a flag; at a step boundary all ranks agree on it.

The control plane sends SIGUSR1 to every rank (SIGTERM after the grace period), but signals
arrive at slightly different moments: rank 0 may see its notice during step 41 and rank 1 during
step 42. If each rank checkpointed when *it* saw the notice, they would save different steps
(or wait for each other in different collectives: a deadlock). So the handler only sets a flag;
at every step boundary `should_stop()` takes the maximum of the flag over all ranks (one tiny
all-reduce on the runtime's gloo group), and every rank gets the same answer at the same step.
A rank that got no signal at all (a launcher that signals only one process) stops too.

A second SIGTERM while the first is still pending restores the default action and re-raises, so
an operator can still kill a job that does not reach a step boundary.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

import torch
import torch.distributed as dist

from trainyard.contracts import NOTICE_SIGNAL, PREEMPT_SIGNALS


class PreemptionHandler:
    """Installs the signal handlers; `should_stop()` is the collective agreement.

    Args:
        group: process group for the agreement (a gloo group; `Context.control_group`). None
            and no initialized process group: single process, no collective.
        signals: the signals that mean "checkpoint and exit 75".
    """

    def __init__(self, group: Any = None, signals: tuple[signal.Signals, ...] = PREEMPT_SIGNALS) -> None:
        self.group = group
        self.signals = signals
        self.received: signal.Signals | None = None  # the first notice this rank got
        self._previous: dict[int, Any] = {}
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._installed = False

    def install(self) -> PreemptionHandler:
        """Install the handlers (main thread only; elsewhere a warning and nothing installed)."""
        if threading.current_thread() is not threading.main_thread():
            print("trainyard.runtime: preemption handler not installed (not in the main thread)", file=sys.stderr)
            return self
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        self._installed = True
        return self

    def uninstall(self) -> None:
        if not self._installed:
            return
        for sig, prev in self._previous.items():
            try:
                signal.signal(sig, prev)
            except (TypeError, ValueError):
                pass
        self._installed = False

    def _on_signal(self, signum: int, frame: Any) -> None:
        sig = signal.Signals(signum)
        if self.received is not None and sig == signal.SIGTERM and self.received == signal.SIGTERM:
            # Second SIGTERM: the operator insists; die the default way.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGTERM)
            return
        if self.received is None:
            self.received = sig
            # os.write, not sys.stderr: the handler may interrupt a write to sys.stderr's buffer,
            # and a buffered write from inside it raises "reentrant call".
            msg = f"trainyard.runtime: got {sig.name}: checkpoint at the next step boundary, then exit 75\n"
            try:
                os.write(2, msg.encode())
            except OSError:
                pass
        elif sig == signal.SIGTERM:
            self.received = sig

    def request(self) -> None:
        """Ask for a stop from code (as if a notice had arrived on this rank)."""
        if self.received is None:
            self.received = NOTICE_SIGNAL

    @property
    def local(self) -> bool:
        """This rank got a notice."""
        return self.received is not None

    def should_stop(self) -> bool:
        """Collective: True on every rank iff any rank got a notice. Call at a step boundary."""
        local = 1 if self.received is not None else 0
        group = self.group
        if group is None and not (dist.is_available() and dist.is_initialized()):
            return bool(local)
        self._flag.fill_(local)
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=group)
        return bool(self._flag.item())
