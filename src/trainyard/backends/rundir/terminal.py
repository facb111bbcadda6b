"""The plane's side of a terminal in a rank (`Backend.open_terminal`, issue 38): a new pseudo-terminal
and a process on it, and the end of what such a process left behind.

`spawn` opens a pty of the asked size and starts `argv` in a new session with the pty's slave as
its stdin, stdout and stderr (`posix_spawn` with `setsid`: no fork of the threaded plane, no
Python between fork and exec, no `subprocess.Popen` whose finalizer might reap the child before the
caller's `os.waitpid`). The child makes the slave its controlling terminal itself (TIOCSCTTY: then
Ctrl-C is SIGINT to the foreground job): the local backend's `rundir/attach.py` does; any other
command goes through `with_ctty`, a few lines of Python that do it and exec the command. The plane
keeps the master: `Terminal.fd`.

The environment of the child is given whole (never the plane's own: its secrets stay its own).

`end_sessions` kills every process of the sessions of terminals an attempt left open, for the
attempt's release: a rank's cell drains them already where it has cgroups, this covers the
subreaper mode (no cgroup to join) and anything that left the cell.
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import sys
import termios
from pathlib import Path

from trainyard.backends.base import Terminal
from trainyard.backends.rundir import procfs

ATTACH = Path(__file__).parent / "attach.py"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_TERM = "xterm-256color"
# what a child of the plane starts with as signal dispositions: the default for each
SIGDEF = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ,
          signal.SIGUSR1, signal.SIGUSR2, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD)


def set_size(fd: int, rows: int, cols: int) -> None:
    """The terminal's size (TIOCSWINSZ) on either end of a pty; the foreground job gets SIGWINCH."""
    rows, cols = (min(max(1, int(n)), 0xFFFF) for n in (rows, cols))  # what a winsize holds
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


# takes the terminal on stdin as the controlling one, enters argv[1] (if it can; "" for none), resets
# what Python ignores, executes argv[2:]
CTTY_SHIM = ("import fcntl, os, signal, sys, termios\n"
             "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
             "try:\n"
             "    sys.argv[1] and os.chdir(sys.argv[1])\n"
             "except OSError:\n"
             "    pass\n"
             "[signal.signal(s, signal.SIG_DFL) for s in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT)]\n"
             "try:\n"
             "    os.execvpe(sys.argv[2], sys.argv[2:], os.environ)\n"
             "except OSError as e:\n"
             "    os.write(2, f'trainyard: cannot execute {sys.argv[2]!r}: {e.strerror}\\r\\n'.encode())\n"
             "    sys.exit(127 if isinstance(e, FileNotFoundError) else 126)\n")


def with_ctty(argv: list[str], cwd: str = "") -> list[str]:
    """`argv` (looked up on the PATH of the environment it is given) behind the shim that makes the
    pty its controlling terminal first, in `cwd` where it can enter it (posix_spawn has no cwd)."""
    return [sys.executable, "-I", "-S", "-c", CTTY_SHIM, cwd, *argv]


def spawn(argv: list[str], env: dict[str, str], rows: int = 24, cols: int = 80, *,
          new_session: bool = True) -> Terminal:
    """`argv` (argv[0] a path) on a new pty of `rows` x `cols`, in a new session (`new_session`;
    else `argv` makes one itself), with `env` alone.

    Raises:
        OSError: no pty, or the program cannot be started.
    """
    master, slave = os.openpty()  # both close-on-exec (PEP 446); the child gets the slave by dup2
    try:
        set_size(master, rows, cols)
        actions = [(os.POSIX_SPAWN_DUP2, slave, 0), (os.POSIX_SPAWN_DUP2, slave, 1), (os.POSIX_SPAWN_DUP2, slave, 2)]
        pid = os.posix_spawn(argv[0], argv, env, file_actions=actions, setsid=new_session, setsigdef=SIGDEF,
                             setsigmask=())
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    return Terminal(master, pid)


def attach_argv(run_dir: Path, rank: int, argv: list[str]) -> list[str]:
    """The command line of `attach.py` for `rank` of the attempt in `run_dir` (see there)."""
    return [sys.executable, "-I", "-S", str(ATTACH), str(run_dir), str(rank), "--", *argv]


def attach_env(term: str = DEFAULT_TERM) -> dict[str, str]:
    """The helper's own environment: TERM (which it passes on) and a PATH; nothing of the plane's."""
    return {"TERM": term, "PATH": DEFAULT_PATH}


def session_members(sid: int, not_before: int) -> list[int]:
    """Live processes of session `sid` started at or after `not_before` (clock ticks). Linux hands
    out no pid while it is still a session's id, so while members are left they are of that session."""
    out = []
    for name in os.listdir("/proc"):  # plane's own: the kernel's process list
        if name.isdigit() and (st := procfs.read_stat(int(name))) is not None and not st.exited \
                and st.session == sid and st.start_time >= not_before:
            out.append(st.pid)
    return out


def end_sessions(started: list[tuple[int, int]]) -> None:
    """SIGKILL every process of each terminal's session ((leader pid, its start time)); a leader
    pid now held by another process (recycled: its session is over) is skipped."""
    for sid, start in started:
        st = procfs.read_stat(sid)
        if st is not None and st.start_time != start:
            continue
        for pid in session_members(sid, start):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
