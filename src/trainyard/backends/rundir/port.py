"""The plane's side of a forwarded port in a rank (`Backend.open_port`, issue 38: `yard port-forward`).

`connect_in_rank` starts `rundir/attach.py --connect PORT` (the way into the rank that `yard
shell` takes: the rank's process checked to be the recorded one, its cgroups, namespaces, the
owner's identity) with one end of a unix socketpair as its fd 0, and receives from it either the
connected TCP socket (SCM_RIGHTS) or one line saying why not. The plane never connects on the
job's behalf: the socket it gets was made by a process of the owner's, in the rank's network.

`start_relay` is the Slurm backend's way (no run dir of its own on the nodes to start attach.py
from): a command that runs `RELAY` in the job (`srun --overlap` as the owner) with pipes for its
stdin and stdout; the relay connects, says b"+" (or b"-why"), then copies bytes both ways.

`posix_spawn` as `rundir/terminal.py` does (no fork of the threaded plane); the helper's stdout and
stderr are /dev/null (it reports over the socketpair), its environment a PATH alone. The helper is
reaped here before this returns, and killed if it has not answered within `ANSWER_WAIT_S` (a rank
whose cgroup is frozen would hold it).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import stat
import sys
import time
from pathlib import Path

from trainyard.backends.base import BackendError, NothingListens, Tunnel
from trainyard.backends.rundir.terminal import ATTACH, DEFAULT_PATH, SIGDEF

ANSWER_WAIT_S = 15.0  # the helper's own connect gives up after 10 s
RELAY_WAIT_S = 60.0  # a Slurm step takes seconds to start
MESSAGE_MAX = 4096
NOTHING_LISTENS = "nothing listens on port"  # attach.py's and RELAY's words for a refused connection

# The relay: argv[1] the port. b"+" once connected (or b"-" and why, exit 3), then stdin → socket
# (its end: the socket's write side shut), socket → stdout, until the job's side ends.
RELAY = ("import os, socket, sys, threading\n"
         "port, s, refused, err = int(sys.argv[1]), None, False, None\n"
         "for host in ('127.0.0.1', '::1'):\n"
         "    try:\n"
         "        s = socket.create_connection((host, port), 10)\n"
         "        break\n"
         "    except OSError as e:\n"
         "        refused, err = refused or isinstance(e, ConnectionRefusedError), err or e\n"
         "if s is None:\n"
         "    why = f'nothing listens on port {port}' if refused else f'cannot connect to port {port}: {err}'\n"
         "    os.write(1, b'-' + why.encode())\n"
         "    sys.exit(3)\n"
         "s.settimeout(None)\n"
         "os.write(1, b'+')\n"
         "def up():\n"
         "    try:\n"
         "        while d := os.read(0, 65536):\n"
         "            s.sendall(d)\n"
         "        s.shutdown(socket.SHUT_WR)\n"
         "    except OSError:\n"
         "        pass\n"
         "threading.Thread(target=up, daemon=True).start()\n"
         "try:\n"
         "    while d := s.recv(65536):\n"
         "        while d:\n"
         "            d = d[os.write(1, d):]\n"
         "except OSError:\n"
         "    pass\n")


class PortError(Exception):
    """Why no connection was made (one line: "nothing listens on port P", "rank 1 has ended");
    `refused`: the rank runs but nothing listens on the port."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.refused = message.startswith(NOTHING_LISTENS)


def backend_error(e: PortError, job_id: int, rank: int, port: int) -> BackendError:
    """The backends' error for a connection not made: NothingListens when the rank runs but nothing
    listens on `port` (the plane answers 502), a BackendError naming the job and rank otherwise."""
    if e.refused:
        return NothingListens(f"nothing listens on port {port} in job {job_id} rank {rank}")
    return BackendError(f"job {job_id} rank {rank}: {e}")


def connect_argv(run_dir: Path, rank: int, port: int) -> list[str]:
    """The command line of `attach.py` connecting to `port` in `rank` of the attempt in `run_dir`."""
    return [sys.executable, "-I", "-S", str(ATTACH), str(run_dir), str(rank), "--connect", str(port)]


def connect_in_rank(run_dir: Path, rank: int, port: int, wait_s: float = ANSWER_WAIT_S) -> int:
    """A connected TCP socket's fd (close-on-exec, blocking) to `port` in the rank's network, made
    by the helper as the owner (see the module docstring).

    Raises:
        PortError: the helper refused (its line), ended without an answer, or did not answer in time.
        OSError: the helper could not be started.
    """
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        argv = connect_argv(run_dir, rank, port)
        actions = [(os.POSIX_SPAWN_DUP2, theirs.fileno(), 0),
                   (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                   (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)]
        pid = os.posix_spawn(argv[0], argv, {"PATH": DEFAULT_PATH}, file_actions=actions, setsigdef=SIGDEF,
                             setsigmask=())
    except BaseException:
        mine.close()
        raise
    finally:
        theirs.close()  # the helper's copy is its own now: its exit is an end of file here
    try:
        return _answer(mine, pid, wait_s)
    finally:
        mine.close()
        _reap(pid)


def _answer(chan: socket.socket, pid: int, wait_s: float) -> int:
    deadline = time.monotonic() + wait_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([chan], [], [], left)[0]:
            _kill(pid)
            raise PortError(f"no answer from inside the rank within {wait_s:.0f} s")
        try:
            msg, fds, _, _ = socket.recv_fds(chan, MESSAGE_MAX, 1, socket.MSG_CMSG_CLOEXEC)
        except InterruptedError:
            continue
        break
    fd = fds[0] if fds else None
    for extra in fds[1:]:
        os.close(extra)
    if fd is not None and msg == b"ok":
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            os.set_blocking(fd, True)
            return fd
        os.close(fd)
        raise PortError("the helper handed over something that is not a socket")
    if fd is not None:
        os.close(fd)
    text = msg.decode(errors="replace").strip()
    if text.startswith("error: "):
        raise PortError(" ".join(text[len("error: "):].split())[:500])
    raise PortError("the helper in the rank ended without an answer")


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    """The helper, once it has exited (it exits right after its answer); killed if it lingers."""
    for _ in range(200):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.01)
    _kill(pid)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def relay_argv(python: str, port: int) -> list[str]:
    """`RELAY` for `port`, run by the node's `python` (isolated: nothing of the owner's changes it)."""
    return [python, "-I", "-S", "-c", RELAY, str(port)]


def start_relay(argv: list[str], env: dict[str, str], wait_s: float = RELAY_WAIT_S) -> Tunnel:
    """`argv` (argv[0] a path; it runs `RELAY` where the port is) with pipes as its stdin and
    stdout, its stderr the plane's (srun's own errors go to the plane's log); the Tunnel once the
    relay says it is connected.

    Raises:
        PortError: the relay could not connect (its why), ended first, or did not answer in time.
        OSError: no pipes, or the command cannot be started.
    """
    down_r, down_w = os.pipe()  # the relay's stdout: the job side's bytes
    up_r, up_w = os.pipe()  # its stdin: the client's
    try:
        actions = [(os.POSIX_SPAWN_DUP2, up_r, 0), (os.POSIX_SPAWN_DUP2, down_w, 1)]
        pid = os.posix_spawn(argv[0], argv, env, file_actions=actions, setsid=True, setsigdef=SIGDEF, setsigmask=())
    except BaseException:
        os.close(down_r)
        os.close(up_w)
        raise
    finally:
        os.close(up_r)
        os.close(down_w)
    why: str | None = None  # None: no answer in time
    try:
        if select.select([down_r], [], [], wait_s)[0]:
            first = os.read(down_r, 1)
            if first == b"+":
                return Tunnel(down_r, up_w, pid)
            why = (first + _read_bounded(down_r)).decode(errors="replace")
    except BaseException:
        _end_relay(down_r, up_w, pid)
        raise
    _end_relay(down_r, up_w, pid)
    if why is None:
        raise PortError(f"no answer from the relay in the job within {wait_s:.0f} s")
    if why.startswith("-"):
        raise PortError(" ".join(why[1:].split())[:500])
    raise PortError("the relay in the job ended before it connected (srun's errors are in the plane's log)")


def _end_relay(down_r: int, up_w: int, pid: int) -> None:
    """Its pipes closed, its process group (runuser and srun: `setsid` made `pid` its leader) killed, it reaped."""
    os.close(down_r)
    os.close(up_w)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        _kill(pid)
    _reap(pid)


def _read_bounded(fd: int) -> bytes:
    out = b""
    deadline = time.monotonic() + 5
    while len(out) < MESSAGE_MAX and time.monotonic() < deadline:
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            break
        chunk = os.read(fd, MESSAGE_MAX - len(out))
        if not chunk:
            break
        out += chunk
    return out
