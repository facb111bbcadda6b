"""Who is attached to each running job right now: terminals (`yard shell`, `yard alloc`'s session)
and forwarded ports (`yard port-forward`, `yard notebook`), with when each last carried input.

Kept in the plane's memory (`Plane.sessions`), not in the store: it describes live connections to
this process, which a restart drops anyway. After a restart every job counts as detached since the
plane started, so an allocation gets its whole connection grace to be reattached.

The pumps (`api/terminal.py`, the port pump) call `attach` when a connection is accepted, `touch`
on each input (a keystroke, a forwarded request) and `detach` when it ends; they pass `notify`, a
function that writes a line to their client (a terminal's warning; None for a port). The control
loop's interactive step reads `attached`, `detached_since` and
`last_input`, and calls `warn` to tell every attached terminal of a job that it is about to end.

Thread-safe: the pumps run on the API's event loop, the loop step on the loop's thread.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

Notify = Callable[[str], None]


@dataclass
class _Job:
    attached: dict[int, Notify | None] = field(default_factory=dict)  # attachment id → its notify
    last_input: float | None = None
    detached_since: float | None = None


class Attachment:
    """One connection's handle on its job's record (see `Sessions.attach`)."""

    def __init__(self, owner: "Sessions", job_id: int, ident: int) -> None:
        self._owner, self.job_id, self._id = owner, job_id, ident
        self._open = True

    def touch(self) -> None:
        """Input came through this connection now."""
        self._owner._touch(self.job_id)

    def detach(self) -> None:
        """The connection ended (idempotent)."""
        if self._open:
            self._open = False
            self._owner._detach(self.job_id, self._id)


class Sessions:
    """The registry (see the module docstring). `clock` is the plane's time."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[int, _Job] = {}
        self._next = 0
        self._started = clock()

    def attach(self, job_id: int, notify: Notify | None = None) -> Attachment:
        """A new connection to `job_id`; it counts as input."""
        with self._lock:
            self._next += 1
            rec = self._jobs.setdefault(job_id, _Job())
            rec.attached[self._next] = notify
            rec.last_input = self._clock()
            rec.detached_since = None
            return Attachment(self, job_id, self._next)

    def _touch(self, job_id: int) -> None:
        with self._lock:
            if (rec := self._jobs.get(job_id)) is not None:
                rec.last_input = self._clock()

    def _detach(self, job_id: int, ident: int) -> None:
        with self._lock:
            rec = self._jobs.get(job_id)
            if rec is not None and rec.attached.pop(ident, False) is not False and not rec.attached:
                rec.detached_since = self._clock()

    def attached(self, job_id: int) -> int:
        """How many connections `job_id` has now."""
        with self._lock:
            rec = self._jobs.get(job_id)
            return len(rec.attached) if rec else 0

    def detached_since(self, job_id: int, started: float) -> float | None:
        """Since when `job_id` (started at `started`) has had no connection; None while it has one.
        A job never attached counts from its start, or from the plane's, whichever is later."""
        with self._lock:
            rec = self._jobs.get(job_id)
            if rec is None:
                return max(started, self._started)
            if rec.attached:
                return None
            return rec.detached_since if rec.detached_since is not None else max(started, self._started)

    def last_input(self, job_id: int) -> float | None:
        """When a connection to `job_id` last carried input (None: never, since the plane started)."""
        with self._lock:
            rec = self._jobs.get(job_id)
            return rec.last_input if rec else None

    def warn(self, job_id: int, text: str) -> int:
        """`text` to every attached terminal of `job_id`; how many were told."""
        with self._lock:
            rec = self._jobs.get(job_id)
            targets = [n for n in (rec.attached.values() if rec else ()) if n is not None]
        for notify in targets:
            try:
                notify(text)
            except Exception:  # noqa: BLE001 - one client's trouble keeps no other from the warning
                pass
        return len(targets)

    def forget(self, job_id: int) -> None:
        """The job ended: its record goes (connections still open detach into nothing)."""
        with self._lock:
            self._jobs.pop(job_id, None)
