"""The per-rank phase file, written so that neither a reader nor the training loop is hurt by it.

A reader (the control plane, a person) may open the file at any moment, so each version is
written whole to a temporary file in the same directory and renamed over the old one: the file
is always one complete JSON object. The training loop never waits for a write (a slow or hung
file system must not slow the steps): `submit` hands the newest record to a daemon thread, which
writes only the newest it has when it gets to it. `close` writes the last record on the caller's
thread, after the thread has finished (or five seconds, whichever first). A write that fails
prints one warning for the run and is otherwise ignored: timings are not worth a training run.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any


class PhaseFile:
    def __init__(self, path: Path, *, rank: int = 0) -> None:
        self.path, self.rank = path, rank
        self.writes = 0  # versions written (tests and the benchmark read it)
        self._cv = threading.Condition()
        self._pending: dict[str, Any] | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        self._warned = False
        self._dir_made = False

    def submit(self, record: dict[str, Any]) -> None:
        """Write `record` soon, on the writer thread; a newer submit replaces one not yet written."""
        with self._cv:
            if self._closed:
                return
            self._pending = record
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trainyard-phases", daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._pending is None and not self._closed:
                    self._cv.wait()
                record, self._pending = self._pending, None
            if record is None:
                return
            self.write(record)

    def close(self, final: dict[str, Any], timeout_s: float = 5.0) -> None:
        """Stop the writer thread and write `final` before returning."""
        with self._cv:
            self._closed = True
            self._pending = None  # `final` is newer
            self._cv.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        self.write(final)

    def write(self, record: dict[str, Any]) -> bool:
        """One atomic version of the file (temporary file in the same directory, then rename)."""
        # per thread: a final write never shares a temporary file with a writer thread left hanging
        tmp = self.path.with_name(f".{self.path.name}.{threading.get_ident()}.tmp")
        try:
            text = json.dumps(record, allow_nan=False, separators=(",", ":"))
            if not self._dir_made:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._dir_made = True
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, self.path)
        except (OSError, ValueError) as e:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            if not self._warned:
                self._warned = True
                print(f"trainyard.runtime: rank {self.rank}: cannot write the phase timings to {self.path} "
                      f"({e}); training goes on without them", file=sys.stderr, flush=True)
            return False
        self.writes += 1
        return True
