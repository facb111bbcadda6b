"""Reading and writing a `Terminal`'s fd in tests, as a person at a keyboard would: the fd alone.

`Screen.expect(regex)` reads until the output so far matches (the pty's CR LF read as LF);
`Screen.finish()` reads on until the process exits and returns its wait status.
"""

from __future__ import annotations

import os
import re
import select
import time

from trainyard.backends.base import Terminal


class Screen:
    def __init__(self, t: Terminal) -> None:
        self.t = t
        self.seen = ""  # everything read so far
        self._from = 0  # where the next expect looks from

    def _read(self, timeout: float) -> bool:
        """Read what is there within `timeout`; False once the other end is closed."""
        ready, _, _ = select.select([self.t.fd], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.t.fd, 65536)
        except OSError:  # EIO: every process holding the slave has ended
            return False
        if not data:
            return False
        self.seen += data.decode(errors="replace").replace("\r\n", "\n")
        return True

    def expect(self, pattern: str, timeout: float = 15.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while True:
            m = rx.search(self.seen, self._from)
            if m:
                self._from = m.end()
                return m
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(min(left, 0.2)) and not rx.search(self.seen, self._from):
                raise AssertionError(f"no {pattern!r} within {timeout}s; the terminal showed:\n{self.seen}")

    def send(self, text: str) -> None:
        os.write(self.t.fd, text.encode())

    def finish(self, timeout: float = 15.0) -> int:
        """The process's wait status, once it has exited (its output read meanwhile)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.t.pid, os.WNOHANG)
            if pid:
                while self._read(0.05):
                    pass
                return status
            self._read(0.05)
        raise AssertionError(f"the terminal's process did not end within {timeout}s; it showed:\n{self.seen}")

    def wait_for_child(self, name: str, timeout: float = 10.0) -> int:
        """The pid of a child of the terminal's process whose command is `name` (a foreground job
        has started: a Ctrl-C now reaches it, not the line being typed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._read(0.02)
            for entry in os.listdir("/proc"):
                try:
                    stat = open(f"/proc/{entry}/stat").read() if entry.isdigit() else ""
                except OSError:
                    continue
                if stat and stat[stat.rindex(")") + 2:].split()[1] == str(self.t.pid) and f"({name})" in stat:
                    return int(entry)
        raise AssertionError(f"no {name} started within {timeout}s; the terminal showed:\n{self.seen}")

    def close(self) -> None:
        try:
            os.close(self.t.fd)
        except OSError:
            pass
