"""A command in a running rank's place: the helper behind `Backend.open_terminal` (issue 38, `yard shell`)
and `Backend.open_port` (`yard port-forward`).

Usage: python -I -S attach.py <run-dir> <rank> [-- <argv...>]
       python -I -S attach.py <run-dir> <rank> --connect <port>

The plane (root) starts this on a new pseudo-terminal (`rundir/terminal.py`: a new session whose
stdin, stdout and stderr are the pty's slave); it execs `argv` where the rank's command runs, so
the command is in the same cell as the rank and sees what it sees:

1. the terminal becomes the session's controlling terminal (TIOCSCTTY): Ctrl-C reaches the
   foreground command, the session's end hangs its jobs up;
2. the rank's plan (`attempt.json`: `owner`, `contain[<rank>]`, `workdir`) and record
   (`rank-<r>.json`: the runner's pid and start time, `child_pid` and, from runners that record
   it, `child_start_time`) say which process is the rank's: the runner alive with its recorded
   start time, no exit record, the child alive, a child *of that runner* (a subreaper's: the
   container's process is re-parented to it), started after it. A pid that was recycled, or a rank
   that ended, is refused;
3. it opens the rank process's mount namespace, its UTS namespace (the emulated node's name), its
   user namespace (when it differs: a container with `--container-remap-root`), its root directory, and reads its environment
   (`/proc/<pid>/environ`, at most ENV_MAX bytes), then checks the process is still the same one,
   so every descriptor is the rank's;
4. it joins the rank's cgroups: for each `join` directory of the plan, the cgroup of it (or below
   it: a container's) that holds the rank's process, by writing its pid to `cgroup.procs` as the
   runner does: limits, freezer, the drain at the rank's end and the attempt's release reach it;
5. it enters the mount and UTS namespaces (`setns`, through ctypes: the rank's private /tmp, a container's
   image as its root, `chroot` to the rank's root), takes the owner's identity (setgroups, setgid,
   setuid from attempt.json's `owner`; never root when the job has an owner; with a remapped
   container: the owner's groups on the host, then uid and gid 0 inside the user namespace, which
   are the owner's), enters the rank's working directory as the owner (`/proc/<pid>/cwd`; else the
   workdir; else `/`). From the namespaces on until the exec it is not dumpable: a remapped
   container's root (the job) could otherwise ptrace it while it still has the host's uid 0;
6. it executes `argv` (default: `$SHELL` of the rank's environment when it is executable in the
   rank's root, else /bin/bash, else /bin/sh) with the rank's environment and TERM (this process's
   own TERM, which the plane sets; the rest of the plane's environment never reaches it).

An error before the exec is one line on the terminal and exit 126 (127: the command is not found),
as the rank runner's. Standard library only, run with `-I -S`: nothing of the job's environment
or workdir changes how it runs.

With `--connect PORT` (`rundir/port.py` starts it, fd 0 a unix socket to the plane) it does steps
2-5 (also entering the rank's network namespace, where the rank has one of its own), then, as the
owner, connects a TCP socket to 127.0.0.1:PORT (then [::1]:PORT) in the rank's network and hands
the connected socket to the plane over fd 0 (SCM_RIGHTS, with the message b"ok"), or sends one line
`error: <why>` ("nothing listens on port P"), and exits. The connection is the owner's: the socket
was made by a process with the owner's identity, inside the rank's cgroups (cgroup socket filters
apply to it as to the rank's own), so the root plane only ever reads and writes it.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import socket
import stat
import sys
import warnings  # noqa: F401  os.execvpe imports it; after setuid the owner may not read the stdlib
import array  # noqa: F401  socket.send_fds imports it, after setuid (lib-dynload may be root's alone)

NOT_FOUND_EXIT = 127
CANNOT_EXECUTE_EXIT = 126
ENV_MAX = 1 << 20  # bytes of the rank's environment read at most
RECORD_MAX = 1 << 20  # bytes of a run-dir record read at most
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWUTS = 0x20000, 0x10000000, 0x40000000, 0x04000000
CONNECT_TIMEOUT_S = 10.0
PR_SET_DUMPABLE = 4
RESET = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2,
         signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


class Refused(Exception):
    """Why the command cannot run in the rank (one line); `code` is the exit status."""

    def __init__(self, message: str, code: int = CANNOT_EXECUTE_EXIT) -> None:
        super().__init__(message)
        self.code = code


def read_bounded(path: str, limit: int, *, nofollow: bool = True) -> bytes:
    """At most `limit` bytes of the regular file `path`, opened without following a link."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_NOFOLLOW if nofollow else 0)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        chunks, left = [], limit
        while left > 0 and (chunk := os.read(fd, min(left, 65536))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _record(path: str) -> dict | None:
    try:
        rec = json.loads(read_bounded(path, RECORD_MAX))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise Refused(f"cannot read {os.path.basename(path)}: {e}") from e
    return rec if isinstance(rec, dict) else None


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of `pid`, None when there is no such process."""
    try:
        raw = read_bounded(f"/proc/{pid}/stat", 4096, nofollow=False).decode(errors="replace")
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


def rank_process(run_dir: str, rank: int) -> tuple[int, int]:
    """(pid, start time) of the rank's command (a container's process), checked to be the very
    process the runner started and still running; raises Refused otherwise."""
    if os.path.exists(os.path.join(run_dir, f"rank-{rank}.exit")) or \
            os.path.exists(os.path.join(run_dir, f"rank-{rank}.lost")):
        raise Refused(f"rank {rank} has ended")
    rec = _record(os.path.join(run_dir, f"rank-{rank}.json"))
    if rec is None or not rec.get("child_pid"):
        raise Refused(f"rank {rank} has not started (no record of its process)")
    runner = _stat(int(rec["pid"]))
    if runner is None or runner[0] in ("Z", "X") or runner[2] != rec.get("start_time"):
        raise Refused(f"rank {rank} has ended (its runner, pid {rec['pid']}, is gone)")
    pid = int(rec["child_pid"])
    child = _stat(pid)
    if child is None or child[0] in ("Z", "X"):
        raise Refused(f"rank {rank} has ended (its process {pid} is gone)")
    recorded = rec.get("child_start_time")
    if child[1] != int(rec["pid"]) or child[2] < runner[2] or (recorded is not None and child[2] != recorded):
        raise Refused(f"rank {rank} has ended (pid {pid} is another process now)")
    return pid, child[2]


def _still(pid: int, start: int, rank: int) -> None:
    st = _stat(pid)
    if st is None or st[0] in ("Z", "X") or st[2] != start:
        raise Refused(f"rank {rank} ended while the terminal was being opened")


def _procs(d: str) -> set[int]:
    try:
        with open(os.path.join(d, "cgroup.procs")) as f:
            return {int(p) for p in f.read().split()}
    except (OSError, ValueError):
        return set()


def cgroups_of(join: list[str], pid: int) -> list[str]:
    """For each `join` directory, the cgroup at or below it that holds `pid` (a container's cgroup
    is below its rank's, and cgroup v2 takes no process into a cgroup with children), else it."""
    out = []
    for top in join:
        found = top
        for root, _, _ in os.walk(top):
            if pid in _procs(root):
                found = root
                break
        out.append(found)
    return out


def _setns(libc: ctypes.CDLL, fd: int, kind: int, what: str) -> None:
    if libc.setns(fd, kind) != 0:
        e = ctypes.get_errno()
        raise Refused(f"cannot enter the rank's {what} namespace: {os.strerror(e)}")


def _ns_fd(pid: int, name: str) -> int | None:
    """An fd of the rank's namespace `name`, None when it is this process's own already."""
    mine, theirs = os.stat(f"/proc/self/ns/{name}"), os.stat(f"/proc/{pid}/ns/{name}")
    if (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino):
        return None
    return os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)


def _environ(pid: int) -> dict[str, str]:
    raw = read_bounded(f"/proc/{pid}/environ", ENV_MAX, nofollow=False)
    env = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq and key:
            env[key.decode(errors="surrogateescape")] = value.decode(errors="surrogateescape")
    return env


def _executable(path: str) -> bool:
    return os.path.isabs(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def default_shell(env: dict[str, str]) -> list[str]:
    for shell in (env.get("SHELL", ""), "/bin/bash", "/bin/sh"):
        if _executable(shell):
            return [shell]
    raise Refused("no shell in the rank's root ($SHELL, /bin/bash, /bin/sh)", NOT_FOUND_EXIT)


def prepare(run_dir: str, rank: int, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Everything of steps 2-5 (see the module docstring); (argv, env) to execute."""
    env = enter(run_dir, rank)
    return (argv or default_shell(env)), env


def enter(run_dir: str, rank: int) -> dict[str, str]:
    """Steps 2-5: this process in the rank's cgroups and namespaces, as the owner; the rank's environment."""
    try:
        meta = json.loads(read_bounded(os.path.join(run_dir, "attempt.json"), RECORD_MAX))
    except (OSError, ValueError) as e:
        raise Refused(f"cannot read the attempt's plan: {e}") from e
    owner = meta.get("owner")
    plan = (meta.get("contain") or {}).get(str(rank)) or {}
    pid, start = rank_process(run_dir, rank)
    try:
        net, mnt, user, uts = _ns_fd(pid, "net"), _ns_fd(pid, "mnt"), _ns_fd(pid, "user"), _ns_fd(pid, "uts")
        root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        env = _environ(pid)
    except OSError as e:
        _still(pid, start, rank)
        raise Refused(f"cannot reach the rank's process {pid}: {e.strerror or e}") from e
    _still(pid, start, rank)  # every descriptor above is of the rank's very process
    try:
        for d in cgroups_of(list(plan.get("join") or []), pid):
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
    except OSError as e:
        raise Refused(f"cannot enter the rank's cgroup: {e.strerror or e}") from e
    try:
        if owner is not None:  # the owner's groups, while still root on the host
            os.setgroups([int(g) for g in owner.get("groups") or [owner["gid"]]])
    except (OSError, ValueError, KeyError) as e:
        raise Refused(f"cannot take the groups of {owner.get('user')}: {e}") from e
    libc = ctypes.CDLL(None, use_errno=True)
    # Not dumpable until the exec: once in a remapped container's user namespace, its root (the job)
    # holds CAP_SYS_PTRACE there, and this process still has the host's uid 0 until setresuid.
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if net is not None:  # while root on the host: a rank of its own network (its loopback, its ports)
        _setns(libc, net, CLONE_NEWNET, "network")
    if mnt is not None:
        _setns(libc, mnt, CLONE_NEWNS, "mount")
    if uts is not None:  # the emulated node's name (backends/contain/private_tmp.py)
        _setns(libc, uts, CLONE_NEWUTS, "UTS")
    if user is not None:
        _setns(libc, user, CLONE_NEWUSER, "user")
    try:
        os.fchdir(root)
        os.chroot(".")
    except OSError as e:
        raise Refused(f"cannot enter the rank's root: {e.strerror}") from e
    try:
        if user is not None:  # remapped root: 0 inside is the owner outside (contain/oci_spec.py)
            os.setresgid(0, 0, 0)
            os.setresuid(0, 0, 0)
        elif owner is not None:
            os.setresgid(int(owner["gid"]), int(owner["gid"]), int(owner["gid"]))
            os.setresuid(int(owner["uid"]), int(owner["uid"]), int(owner["uid"]))
    except (OSError, ValueError, KeyError) as e:
        raise Refused(f"cannot run as {(owner or {}).get('user')}: {e}") from e
    if owner is not None and int(owner["uid"]) != 0 and os.getuid() == 0 and user is None:
        raise Refused("refusing to stay root in a job that has an owner")
    for where in (f"/proc/{pid}/cwd", plan.get("workdir") or meta.get("workdir") or "/", "/"):
        try:
            os.chdir(where)
            break
        except OSError:
            continue
    env["TERM"] = os.environ.get("TERM") or env.get("TERM") or "xterm-256color"
    return env


def connect(port: int) -> socket.socket:
    """A TCP socket connected to `port` on this network's loopback, IPv4 first (what a server bound
    to "localhost" or 0.0.0.0 listens on), then IPv6; raises Refused naming the port otherwise."""
    errors: list[OSError] = []
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        except OSError as e:  # no IPv6 here
            errors.append(e)
            continue
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            sock.connect((host, port))
        except OSError as e:
            sock.close()
            errors.append(e)
            continue
        sock.setblocking(True)
        return sock
    if any(isinstance(e, ConnectionRefusedError) for e in errors):
        raise Refused(f"nothing listens on port {port}")
    raise Refused(f"cannot connect to port {port}: {errors[0].strerror or errors[0] if errors else '?'}")


def connect_main(run_dir: str, rank: int, port: int) -> int:
    """`--connect`: the connected socket to the plane over fd 0, or one line of why not."""
    plane = socket.socket(fileno=0)
    try:
        enter(run_dir, rank)
        sock = connect(port)
    except Refused as e:
        plane.send(f"error: {e}".encode(errors="replace")[:4000])
        return e.code
    except Exception as e:  # noqa: BLE001 - the plane gets a line whatever happened
        plane.send(f"error: {type(e).__name__}: {e}".encode(errors="replace")[:4000])
        return CANNOT_EXECUTE_EXIT
    socket.send_fds(plane, [b"ok"], [sock.fileno()])
    return 0


def main(args: list[str]) -> int:
    if len(args) == 4 and args[2] == "--connect" and args[3].isdigit() and args[1].isdigit():
        return connect_main(args[0], int(args[1]), int(args[3]))
    if len(args) < 2 or (len(args) > 2 and args[2] != "--"):
        print("usage: attach.py <run-dir> <rank> [-- <argv...>] | --connect <port>", file=sys.stderr)
        return 2
    import fcntl
    import termios

    try:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    except OSError:
        pass  # not a terminal (a test's pipe): the command runs all the same
    try:
        argv, env = prepare(args[0], int(args[1]), args[3:])
    except Refused as e:
        os.write(2, f"trainyard: cannot open a terminal in the rank: {e}\r\n".encode(errors="replace"))
        return e.code
    for sig in RESET:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        code = NOT_FOUND_EXIT if isinstance(e, FileNotFoundError) else CANNOT_EXECUTE_EXIT
        os.write(2, f"trainyard: cannot execute {argv[0]!r}: {e.strerror}\r\n".encode(errors="replace"))
        return code
    return CANNOT_EXECUTE_EXIT  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
