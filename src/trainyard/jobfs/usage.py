"""`UsageWalk`: `du -sx` of a directory below a `Tree`, in slices, with bounded descriptors and
memory whatever the tree's shape (the storage meter's walk of job dirs)."""

from __future__ import annotations

import os
import stat
import time
from typing import Any

from trainyard.jobfs.tree import _DIR, Tree

USAGE_OPEN_DIRS = 32  # descriptors a `UsageWalk` run holds at most (and one for its top)
USAGE_PENDING = 1 << 16  # subdirectory names a walk keeps waiting (then it walks them and scans on)
USAGE_LINKS = 1 << 16  # files with several names a walk remembers (beyond: counted again, never less)
USAGE_TOPS = 64  # top-level directories a walk keeps a figure of (`by_top`); beyond, theirs go under ""


class UsageWalk:
    """`du -sx` of a directory below a `Tree`, in slices: each `run` counts on from where the last
    one stopped, until its deadline or the end, so a tree too big to walk in one go is still
    counted whole over several runs (the storage meter's sweeps) rather than cut at the same place
    every time, which let a job hide its bytes behind a million empty files.

    Counted: lstat's allocated blocks of every entry, a file with several names once, never through
    a link, never into another file system (as `du -sx`). Bounded whatever the tree's shape (as
    fts(3) is): a directory's subdirectories are walked after its scan, by name, so a directory of
    thousands of them holds one descriptor, not thousands (which ran out, and the rest went
    uncounted); a run holds at most USAGE_OPEN_DIRS descriptors, the deepest levels', and reopens a
    level above them through `..`, checked to be the same directory (else through no link from the
    top, checked at every step). Memory is bounded too: past USAGE_PENDING subdirectory names
    waiting, a scan stops, its subdirectories are walked, and it goes on after the entries it
    counted (a directory changed meanwhile is counted as it reads then); past USAGE_LINKS files
    with several names, a further one is counted again (too much, never too little).

    Beside the allocated bytes it counts the apparent ones (`apparent`: lstat's st_size of the top
    and of every entry, a file with several names once: what `du -sbx` prints), and those per
    top-level directory (`by_top`: name -> apparent bytes of it and all below; the top itself and
    its files under "", so the figures add up to `apparent`), which the storage meter sorts into
    kinds (checkpoints, logs, metrics, other).

    Between runs it keeps, per level of the way down, the directory's name, (st_dev, st_ino), how
    many entries of its scan were counted (a cut scan goes on after them) and its subdirectories
    still to walk; no descriptor. A level moved or swapped meanwhile is left out and `whole` says so.
    """

    def __init__(self, tree: Tree, path: str | os.PathLike[str] = "") -> None:
        self.tree, self.path = tree, path
        self._start()

    def _start(self) -> None:
        self.total = 0  # bytes counted so far (allocated blocks)
        self.apparent = 0  # apparent bytes counted so far (st_size)
        self.by_top: dict[str, int] = {}  # apparent bytes per top-level directory ("" the rest)
        self.entries = 0  # entries counted so far
        self.finished = False
        self.whole = True  # False: a part could not be walked (moved, swapped, not reachable)
        self._levels: list[list[Any]] | None = None  # [name, (dev, ino), entries scanned or -1, subdirs]
        self._dev = 0
        self._pending = 0
        self._seen: set[tuple[int, int]] = set()

    def run(self, deadline: float | None = None, max_entries: int | None = None) -> bool:
        """Count on until `deadline` (time.monotonic()) or `max_entries` more entries; True once
        the whole tree is counted (or found missing: `whole` False)."""
        if self.finished:
            return True
        budget = max_entries if max_entries is not None else -1
        try:
            with self.tree.dir_fd(self.path) as top:
                st = os.fstat(top)
                if self._levels is None or self._levels[0][1] != (st.st_dev, st.st_ino):
                    self._start()  # the first run, or the top was replaced: from the start
                    self._dev, self._levels = st.st_dev, [["", (st.st_dev, st.st_ino), 0, []]]
                    self._add_apparent("", st.st_size)
                fds: list[int | None] = [os.dup(top)] + [None] * (len(self._levels) - 1)
                try:
                    self._reopen(fds)
                    done = self._walk(fds, deadline, budget)
                finally:
                    for fd in fds:
                        if fd is not None:
                            os.close(fd)
        except OSError:
            self.whole, done = False, True  # the top is gone, or not a directory reached through no link
        self.finished = done
        return done

    def _walk(self, fds: list[int | None], deadline: float | None, budget: int) -> bool:
        levels = self._levels
        assert levels is not None
        n = 0  # entries counted in this run: it counts at least one before it looks at the clock
        while levels:
            level, fd = levels[-1], fds[-1]
            assert fd is not None
            if level[3]:  # down into its next subdirectory
                name = level[3].pop()
                self._pending -= 1
                try:
                    child = os.open(name, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    continue  # removed meanwhile
                except OSError:
                    self.whole = False  # swapped for a link, or not ours to open: left out, said so
                    continue
                st = os.fstat(child)
                levels.append([name, (st.st_dev, st.st_ino), 0, []])
                fds.append(child)
                if len(fds) - 1 - USAGE_OPEN_DIRS >= 1:  # hold the deepest levels' descriptors only
                    k = len(fds) - 1 - USAGE_OPEN_DIRS
                    if fds[k] is not None:
                        os.close(fds[k])  # type: ignore[arg-type]
                        fds[k] = None
            elif level[2] >= 0:  # scan it, on after the entries counted before
                with os.scandir(fd) as it:
                    for i, e in enumerate(it):
                        if i < level[2]:
                            continue
                        if budget == 0 or (deadline is not None and n % 256 == 1 and time.monotonic() > deadline):
                            level[2] = i
                            return False
                        if self._pending >= USAGE_PENDING and level[3]:
                            level[2] = i  # enough names waiting: walk them, then scan on from here
                            break
                        budget -= 1
                        n += 1
                        self.entries += 1
                        self._count(e, level)
                    else:
                        level[2] = -1
            else:  # done with it: back up
                levels.pop()
                fds.pop()
                try:
                    if fds and fds[-1] is None:
                        self._reopen(fds, via=fd)
                finally:
                    os.close(fd)
        return True

    def _count(self, e: os.DirEntry[str], level: list[Any]) -> None:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            return  # gone meanwhile
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if key in self._seen:
                return
            if len(self._seen) < USAGE_LINKS:  # beyond: counted again (too much, never too little)
                self._seen.add(key)
        self.total += st.st_blocks * 512
        levels = self._levels
        top = e.name if levels is not None and len(levels) == 1 and stat.S_ISDIR(st.st_mode) else \
            levels[1][0] if levels is not None and len(levels) > 1 else ""
        self._add_apparent(top, st.st_size)
        if stat.S_ISDIR(st.st_mode) and st.st_dev == self._dev:
            self._pending += 1
            level[3].append(e.name)

    def _add_apparent(self, top: str, n: int) -> None:
        self.apparent += n
        if top not in self.by_top and len(self.by_top) > USAGE_TOPS:
            top = ""
        self.by_top[top] = self.by_top.get(top, 0) + n

    def _reopen(self, fds: list[int | None], via: int | None = None) -> None:
        """Open the levels whose descriptors are closed, down to the last: through `..` of `via`
        (the level below, being left) when that is the same directory, else from the deepest open
        level through no link, each step checked to be the directory it was. A level that is not
        is dropped with those below it (`whole` False)."""
        levels = self._levels
        assert levels is not None
        if via is not None:
            try:
                up = os.open("..", _DIR, dir_fd=via)
            except OSError:
                up = None
            if up is not None:
                st = os.fstat(up)
                if (st.st_dev, st.st_ino) == levels[len(fds) - 1][1]:
                    fds[-1] = up
                    return
                os.close(up)
        j = max(i for i, fd in enumerate(fds) if fd is not None)
        for i in range(j + 1, len(fds)):
            try:
                fd: int | None = os.open(levels[i][0], _DIR, dir_fd=fds[i - 1])
            except OSError:
                fd = None
            if fd is not None:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != levels[i][1]:
                    os.close(fd)
                    fd = None
            if fd is None:
                self._pending -= sum(len(x[3]) for x in levels[i:])
                del levels[i:], fds[i:]
                self.whole = False
                return
            fds[i] = fd
            if i - 1 > j and i - 1 < len(fds) - USAGE_OPEN_DIRS:
                os.close(fds[i - 1])  # type: ignore[arg-type]
                fds[i - 1] = None
