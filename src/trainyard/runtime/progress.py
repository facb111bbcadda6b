"""Progress reports to the control plane: optional, non-blocking, never fatal.

When `TRAINYARD_API` is set, rank 0 POSTs JSON to `$TRAINYARD_API/api/v1/jobs/<job id>/progress`
with `Authorization: Bearer $TRAINYARD_TOKEN`:

    {"attempt": 2, "step": 1200, "time": 1764500000.0, "event": "progress",
     "last_checkpoint_step": 1000, "last_checkpoint_time": 1764499900.0,
     "metrics": {"loss": 2.31, "step_time_s": 0.41, "samples_per_s": 156.1, "samples": 76800}}

`event` is one of "start", "resume", "progress", "checkpoint", "preempted", "finished".
Step reports ("progress") go out at most every `interval_s`, the newest superseding unsent ones;
every other event is sent, in order, at once. Training never waits for the network: `report()`
hands the payload to a daemon thread and returns. A failed POST prints one warning (then one per
different error) and is otherwise ignored — the control plane also reads checkpoints and exit
codes from disk, so a lost report costs freshness, not correctness (docs/design.md rule 4).
Standard library only (urllib): the runtime needs no HTTP client.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import deque
import urllib.error
import urllib.request
from typing import Any


class ProgressReporter:
    """Posts progress to the control plane from a background thread.

    Args:
        api: base URL (`TRAINYARD_API`); None disables reporting (every call is a no-op).
        job_id: `TRAINYARD_JOB_ID`; None disables reporting.
        token: bearer token (`TRAINYARD_TOKEN`).
        attempt: recorded in every payload.
        interval_s: least time between two plain step reports.
        timeout_s: per-request timeout.
    """

    def __init__(self, api: str | None, job_id: str | None, token: str | None = None, *, attempt: int = 0,
                 interval_s: float = 30.0, timeout_s: float = 5.0) -> None:
        self.enabled = bool(api and job_id)
        self.url = f"{api.rstrip('/')}/api/v1/jobs/{job_id}/progress" if self.enabled and api else ""
        self.token = token
        self.attempt = attempt
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.sent = 0
        self.failed = 0
        self._events: deque[dict[str, Any]] = deque()  # checkpoint/end events: each is sent, in order
        self._step: dict[str, Any] | None = None  # the newest plain step report
        self._last_sent = 0.0
        self._cv = threading.Condition()
        self._closing = False
        self._warned: set[str] = set()
        self._thread: threading.Thread | None = None
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="trainyard-progress", daemon=True)
            self._thread.start()

    def report(self, step: int, *, event: str = "progress", last_checkpoint_step: int | None = None,
               last_checkpoint_time: float | None = None, metrics: dict[str, Any] | None = None) -> None:
        """Queue a report (non-blocking). Events other than "progress" are sent without delay."""
        if not self.enabled:
            return
        payload = {
            "attempt": self.attempt,
            "step": step,
            "time": round(time.time(), 3),
            "event": event,
            "last_checkpoint_step": last_checkpoint_step,
            "last_checkpoint_time": last_checkpoint_time,
            "metrics": metrics or {},
        }
        with self._cv:
            if event == "progress":
                self._step = payload  # the newest step report supersedes an unsent one
            else:
                if len(self._events) >= 100:  # the control plane is unreachable: keep the newest
                    self._events.popleft()
                self._events.append(payload)
                self._step = None  # the event carries the same step and newer facts
            self._cv.notify()

    def close(self, timeout_s: float = 3.0) -> None:
        """Send what is pending (waiting at most `timeout_s`), then stop the thread."""
        if not self.enabled or self._thread is None:
            return
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join(timeout=timeout_s)
        self._thread = None

    def _run(self) -> None:
        while True:
            with self._cv:
                while True:
                    if self._events:
                        payload = self._events.popleft()
                        break
                    if self._step is not None:
                        wait = 0.0 if self._closing else self._last_sent + self.interval_s - time.monotonic()
                        if wait <= 0:
                            payload, self._step = self._step, None
                            break
                    elif self._closing:
                        return
                    else:
                        wait = None
                    self._cv.wait(wait)
            self._post(payload)
            self._last_sent = time.monotonic()

    def _post(self, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        req = urllib.request.Request(self.url, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                resp.read()
            self.sent += 1
        except (urllib.error.URLError, OSError, ValueError) as e:
            self.failed += 1
            key = f"{type(e).__name__}: {getattr(e, 'code', '')} {getattr(e, 'reason', e)}"
            if key not in self._warned:
                self._warned.add(key)
                print(f"trainyard.runtime: progress report to {self.url} failed ({key}); training continues",
                      file=sys.stderr, flush=True)
