"""A path source read as its reader: a forked child that has taken the reader's groups, gid and
uid (as `jobfs.as_owner` does) and streams what it reads to the plane through a pipe.

Why a child that streams, not `as_owner`'s one answer: a dataset is gigabytes, and the plane
(root) must copy only what the member who added it could read. The kernel checks every open in
the child as the member's; the plane only writes what comes through the pipe. The plane waits at
most `stall_s` for each piece (a hung shared file system, a FIFO: the child is killed, the read
fails as unreachable), so no source holds the plane.

The pipe carries frames: one type byte, a 4-byte big-endian length, the payload:

    D rel       a directory below the source        F rel       a regular file begins
    C bytes     a piece of the current file         E           the current file ends
    P           progress (the child is alive)
    R json      the child's answer (and its end)    X json      the child's error (and its end)

A child that is not root's business (`jobfs.plane_acts_for` says no: no reader, or a plane that is
not root) is forked all the same, without the change of identity, for the time limit.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import select
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from trainyard.jobfs import plane_acts_for
from trainyard.staging.local_tree import NotPlain
from trainyard.staging.types import Reader

_HEAD = 5
_PIPE_SIZE = 1 << 20
_GATHER = 256 << 10  # the child writes when it has this much to say
FLUSH_S = 0.5  # ... or when it last wrote this long ago
Send = Callable[[bytes, bytes], None]


class ChildFailed(Exception):
    """The child's error: `code` is "not_plain", "identity" or an errno name's number as text."""

    def __init__(self, code: str, message: str, errnum: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.errnum = errnum


class Stalled(Exception):
    """The child sent nothing for `stall_s` seconds (and was killed)."""


def _sender(fd: int) -> tuple[Send, Callable[[], None]]:
    """The child's `send` and `flush`: small frames are gathered and written together (a frame per
    small file, each its own write, would wake the plane thousands of times), at least every
    FLUSH_S so that the plane hears from a slow child well within its time limit."""
    buf = bytearray()
    last = [time.monotonic()]

    def write(data: bytes | bytearray) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    def flush() -> None:
        write(buf)
        buf.clear()
        last[0] = time.monotonic()

    def send(kind: bytes, payload: bytes = b"") -> None:
        buf.extend(kind + len(payload).to_bytes(4, "big"))
        if len(payload) >= _GATHER:  # a big piece goes as it is, after what was gathered
            flush()
            write(payload)
            return
        buf.extend(payload)
        if len(buf) >= _GATHER or kind in (b"R", b"X") or time.monotonic() - last[0] >= FLUSH_S:
            flush()
    return send, flush


def _child(w: int, reader: Reader | None, work: Callable[[Send], Any]) -> None:
    """In the forked child: become the reader, run `work`, send its answer or its error; never returns."""
    send, _ = _sender(w)
    try:
        try:
            if plane_acts_for(reader):
                assert reader is not None
                os.setgroups(list(reader.groups) or [reader.gid])
                os.setgid(reader.gid)
                os.setuid(reader.uid)
        except (OSError, ValueError, OverflowError) as e:
            send(b"X", json.dumps({"code": "identity", "message": f"cannot read as uid {reader.uid if reader else '?'}: "
                                   f"{getattr(e, 'strerror', None) or e}"}).encode())
            return
        try:
            out = work(send)
        except NotPlain as e:
            send(b"X", json.dumps({"code": "not_plain", "message": e.strerror or str(e), "errno": e.errno}).encode())
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            send(b"X", json.dumps({"code": "os", "message": where + (e.strerror or str(e)), "errno": e.errno}).encode())
        except BaseException as e:  # noqa: BLE001 - reported to the parent, never raised here
            send(b"X", json.dumps({"code": "error", "message": f"{type(e).__name__}: {e}"}).encode())
        else:
            send(b"R", json.dumps(out).encode())
    except BaseException:  # noqa: BLE001 - the parent went away (EPIPE): nothing to tell
        pass
    finally:
        os._exit(0)


class Frames:
    """The parent's end of the pipe: frames read with at most `stall_s` of silence each."""

    def __init__(self, fd: int, stall_s: float) -> None:
        self.fd = fd
        self.stall_s = stall_s
        self.buf = bytearray()
        self.answer: Any = None

    def _fill(self, need: int) -> None:
        while len(self.buf) < need:
            ready, _, _ = select.select([self.fd], [], [], self.stall_s)
            if not ready:
                raise Stalled(f"nothing read in {self.stall_s:g} s")
            data = os.read(self.fd, 1 << 20)
            if not data:
                raise ChildFailed("error", "the reading child ended without an answer")
            self.buf += data

    def next(self) -> tuple[bytes, bytes]:
        self._fill(_HEAD)
        kind, size = bytes(self.buf[:1]), int.from_bytes(self.buf[1:_HEAD], "big")
        self._fill(_HEAD + size)
        payload = bytes(self.buf[_HEAD:_HEAD + size])
        del self.buf[:_HEAD + size]
        return kind, payload

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        """Every frame up to the answer but the P ones: R's payload (in `answer`) ends the iteration;
        X raises ChildFailed."""
        while True:
            kind, payload = self.next()
            if kind == b"R":
                self.answer = json.loads(payload)
                return
            if kind == b"X":
                err = json.loads(payload)
                raise ChildFailed(err["code"], err["message"], err.get("errno"))
            if kind != b"P":
                yield kind, payload


@contextmanager
def reading_as(reader: Reader | None, work: Callable[[Send], Any], stall_s: float) -> Iterator[Frames]:
    """Fork a child that becomes `reader` and runs `work(send)`; the frames it sends. The child is
    killed (if still there) and reaped when the block ends."""
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    except OSError:
        pass  # a smaller pipe is only slower
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(w, reader, work)
    os.close(w)
    try:
        yield Frames(r, stall_s)
    finally:
        os.close(r)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _reap(pid)


def _reap(pid: int) -> None:
    deadline = time.monotonic() + 5
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done or time.monotonic() > deadline:
            return
        time.sleep(0.005)


def errno_of(e: ChildFailed) -> int:
    return e.errnum if e.errnum is not None else errno.EIO
