"""Rank runner: the small parent of one rank's command that outlives the control plane.

Usage: python -I -S rank_runner.py <run-dir> <rank> -- <command...>

Why it exists: a process's exit status can only be collected by its parent. If the control plane
were the parent and got killed, a rank ending afterwards would leave no trace of how it ended. So
the local backend starts this runner (in a new session: it is the process-group leader) and the
runner starts the command as its child in the same group. The runner

1. reads its rank's plan from `<run-dir>/attempt.json` (written by the backend before any rank
   starts): `owner` {user, uid, gid, groups} and `contain[<rank>]` {mode, join, freezer, kill,
   memory, pids_max, pids_events, pids_node, tmp} (see `backends.contain`);
2. forks the command's process, which, before it executes anything of the job, writes its pid to
   `<dir>/cgroup.procs` of every cgroup in `join` (so the command and every descendant, whatever
   sessions it creates, are inside them), enters its private /tmp and /dev/shm (`tmp`, below),
   then drops to the owner (setgroups, setgid, setuid), enters the working directory as the owner
   (attempt.json's `workdir`: root's rights never open a way into it) and executes the command.
   In `subreaper` mode the runner is a child subreaper instead (PR_SET_CHILD_SUBREAPER): orphaned
   descendants are re-parented to it, not to init;
3. writes `<run-dir>/rank-<r>.json` = {pid, start_time, pgid, child_pid, child_start_time} (or `error` when the
   command cannot be executed), which tells the backend the rank is up and lets a later control
   plane find it and check the pid was not recycled;
4. survives the signals the control loop sends (SIGUSR1 preemption notice, SIGTERM, ...): the
   backend signals the processes of the rank's cgroup (or, in subreaper mode, the runner's
   descendants), and a signal that reaches the runner's group only keeps it waiting;
5. when the command ends, kills whatever it left behind in the rank's cgroup (or among the
   runner's descendants) and waits until none is left, like slurmstepd at the end of a step:
   a rank is over only when nothing of it runs. While it runs, with a pids limit (`pids_events`),
   the runner reads pids.events every PIDS_POLL_S: the first fork or thread the kernel refused
   at the limit ends the rank (a fork bomb never stops by itself; it would hold the node's
   limit until its time limit);
6. writes `<run-dir>/rank-<r>.exit` = {exit_code, signal, oom_killed, pids_max_hit, pids_max,
   pids_peak} atomically; `oom_killed` is the kernel's own count (memory.events /
   memory.oom_control of the rank's memory cgroup), `pids_max_hit` whether a fork of the rank was
   refused at the limit (pids.events), `pids_peak` the node's most tasks at once (pids.peak).

Private /tmp (`tmp` of the plan, `backends/contain/private_tmp.py`): `tmpfs` {root, expose}: the
child unshares its mount namespace, makes / a slave (nothing it mounts propagates back), opens
each `expose` path (the host's /tmp/<name> holding the job's workdir or job dir) *as the owner*
(seteuid: the kernel checks the owner's access, so a bind never shows what the owner could not
reach), binds `<root>/tmp` on /tmp and `<root>/shm` on /dev/shm, and binds the opened paths back
on /tmp/<name>; `dir` {path}: TMPDIR is that directory. TMPDIR is /tmp with a tmpfs. Python has
no unshare or mount: they are libc's, through ctypes. With `hostname` and `hosts` in the tmpfs plan
(the emulated node's name, `private_tmp.named`) the child also unshares its UTS namespace and takes
the node's name, and binds `hosts` on /etc/hosts, so the node's name resolves in the rank.

A full data disk cannot lose the exit record: before the command starts, the runner reserves
`rank-<r>.exit.reserve` (RESERVE_BYTES of blanks, fsynced). When the ordinary write fails for
want of space, the record is written over the reserved bytes (no new block needed) and the file
renamed to `rank-<r>.exit`; if even that fails the runner keeps the wait status and retries
every second, staying alive, so the backend sees the rank running rather than lost (a job that
exited 0 on a full disk used to be judged NODE_FAIL and run again).

The runner itself stays outside the rank's cgroups and keeps the plane's identity (root, when
the plane is root): the job cannot signal it, its memory limit does not cover it, and the
kernel's OOM killer never picks it for the job's allocation. SIGKILL of the runner's group kills
the runner too; then no exit file is written and the backend reports the rank as killed (if it
watched) or lost (if nobody did). A command that cannot be executed is recorded as exit code 127
(not found) or 126 (not executable, or the owner's identity cannot be taken), like a shell, and
the launch fails.

Container mode (the plan's `container`, `LaunchSpec.container` on the local backend): the runner
takes a shared flock on the image's cache entry (eviction skips an image in use) and is a child
subreaper; the child joins the rank's cgroups, sets up the container's mounts and executes
`runc run --detach` as root (`container_start.py`: overlay of the image's layers, the owner's
binds opened as the owner). runc nests the container's cgroup below the rank's and exits once the
container's process runs; that process, orphaned, becomes the runner's child: `child_pid` is it,
and its own exit status (a code, or the signal that killed it) is recorded as a bare command's.
No runc process stays in the rank's cell to proxy signals. Everything that lists, counts or
drains the rank's cgroups includes the cgroups below it; at the end, after the drain, `runc
delete --force` removes the container's state and cgroups.

The runner is run by path with `-I -S` and imports only the standard library, so it starts fast
and nothing in the job's workdir, PYTHONPATH or site-packages can change its behaviour.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time
import warnings  # noqa: F401  os.execvpe imports it; after setuid the owner may not read the stdlib

# Signals the runner itself must survive (the group gets them, the command acts on them).
# contracts.NOT_FOUND_EXIT and CANNOT_EXECUTE_EXIT, by name: this file runs by path with -I -S and loads
# nothing (tests/backends/rundir/test_rank_runner_contracts.py keeps them equal).
NOT_FOUND_EXIT = 127
CANNOT_EXECUTE_EXIT = 126
SURVIVE = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
# Python ignores SIGPIPE/SIGXFSZ at start-up; an ignored disposition survives exec, so reset it.
RESET_IN_CHILD = SURVIVE + (signal.SIGPIPE, signal.SIGXFSZ)
PR_SET_CHILD_SUBREAPER = 36
DRAIN_TIMEOUT_S = 30.0
PIDS_POLL_S = 0.2  # how often a rank with a pids limit reads pids.events
CLONE_NEWNS, CLONE_NEWUTS = 0x20000, 0x04000000
MS_BIND, MS_REC, MS_SLAVE = 0x1000, 0x4000, 0x80000
RESERVE_BYTES = 4096  # room for the exit record, taken before the command starts
RETRY_S = 1.0


def _start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read().decode(errors="replace")
    return int(raw[raw.rindex(")") + 2 :].split()[19])


def _child_start(pid: int) -> int | None:
    """The command's start time, so a later reader (`attach.py`) can tell it from a recycled pid."""
    try:
        return _start_time(pid)
    except (OSError, ValueError, IndexError):
        return None


def _write_json(path: str, obj: dict) -> None:
    """Write atomically: a reader sees the old state or the whole new one, never half a file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)  # a half-written file on a full disk would only take more of it
        except OSError:
            pass
        raise


def _reserve(path: str) -> None:
    """Take the disk space the exit record will need; a disk already full leaves no reserve
    (the ordinary write and the retries still apply)."""
    try:
        with open(path, "wb") as f:
            f.write(b" " * RESERVE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        try:
            os.unlink(path)
        except OSError:
            pass


def _record_exit(exit_path: str, record: dict) -> None:
    """Write the exit record even on a full disk (see the module docstring); returns once written,
    or at once when the run dir is gone (the attempt was released: nobody wants it)."""
    reserve = exit_path + ".reserve"
    while True:
        try:
            _write_json(exit_path, record)
            try:
                os.unlink(reserve)
            except OSError:
                pass
            return
        except OSError as e:
            if e.errno == errno.ENOENT and not os.path.isdir(os.path.dirname(exit_path)):
                return
        try:
            body = json.dumps(record).encode()
            with open(reserve, "r+b") as f:
                f.write(body.ljust(RESERVE_BYTES))  # JSON readers ignore the trailing blanks
                f.flush()
                os.fsync(f.fileno())
            os.replace(reserve, exit_path)
            return
        except OSError:
            time.sleep(RETRY_S)  # keep the wait status; the disk may get room again


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _plan(run_dir: str, rank: int) -> tuple[dict | None, dict]:
    """(owner, containment) of this rank from attempt.json; a missing file means neither."""
    try:
        with open(os.path.join(run_dir, "attempt.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None, {}
    plan = dict((meta.get("contain") or {}).get(str(rank)) or {})
    plan.setdefault("workdir", meta.get("workdir"))
    return meta.get("owner"), plan


# -- starting the command ------------------------------------------------------------------------


def _libc_call(libc: object, name: str, *args: object) -> None:
    if getattr(libc, name)(*args) != 0:
        import ctypes

        e = ctypes.get_errno()
        raise OSError(e, f"{name}: {os.strerror(e)}")


class _NoIdentity(Exception):
    """The owner's identity cannot be taken (reported as such, not as a /tmp failure)."""


def _open_as(owner: dict | None, path: str) -> int | None:
    """An O_PATH descriptor of directory `path` resolved with the owner's access (seteuid and
    back), None when the owner cannot reach it."""
    flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
    if owner is None:
        try:
            return os.open(path, flags)
        except OSError:
            return None
    groups, egid = os.getgroups(), os.getegid()
    try:
        os.setgroups([int(g) for g in owner.get("groups") or [owner["gid"]]])
        os.setegid(int(owner["gid"]))
        os.seteuid(int(owner["uid"]))
    except (OSError, ValueError, OverflowError) as e:
        os.seteuid(0)
        raise _NoIdentity(getattr(e, "strerror", None) or str(e)) from e
    try:
        return os.open(path, flags)
    except OSError:
        return None
    finally:
        os.seteuid(0)
        os.setegid(egid)
        os.setgroups(groups)


def _private_tmp(tmp: dict, owner: dict | None) -> None:
    """Enter the rank's private /tmp and /dev/shm (see the module docstring); sets TMPDIR."""
    if tmp.get("mode") == "dir":
        os.environ["TMPDIR"] = tmp["path"]
        return
    if tmp.get("mode") != "tmpfs":
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    name = (tmp.get("hostname") or "").encode()
    _libc_call(libc, "unshare", CLONE_NEWNS | (CLONE_NEWUTS if name else 0))
    if name:
        _libc_call(libc, "sethostname", name, len(name))
    _libc_call(libc, "mount", None, b"/", None, MS_REC | MS_SLAVE, None)
    # Every source is opened before anything is mounted over /tmp (the tmpfs itself may lie under
    # the host's /tmp, as the data dir of a test does); a mount then takes it by descriptor.
    binds = [(os.open(os.path.join(tmp["root"], "tmp"), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), "/tmp", MS_BIND)]
    if os.path.isdir("/dev/shm"):
        binds.append((os.open(os.path.join(tmp["root"], "shm"), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
                      "/dev/shm", MS_BIND))
    binds += [(fd, target, MS_BIND | MS_REC) for target in tmp.get("expose") or []
              if (fd := _open_as(owner, target)) is not None]
    if tmp.get("hosts") and os.path.isfile("/etc/hosts"):  # the plane's file, in its 0700 tmpfs root
        binds.append((os.open(tmp["hosts"], os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC), "/etc/hosts", MS_BIND))
    for fd, target, flags in binds:
        _libc_call(libc, "mount", f"/proc/self/fd/{fd}".encode(), target.encode(), None, flags, None)
        os.close(fd)
    os.environ["TMPDIR"] = "/tmp"


def _exec_child(command: list[str], owner: dict | None, plan: dict, err_w: int) -> None:
    """In the forked child: enter the cgroups and the private /tmp, become the owner, enter the
    working directory (as the owner, so root's rights never open a way into it), execute. Never
    returns. In container mode: enter the cgroups, set up the container's mounts
    (`container_start.enter`) and execute runc, staying root (runc takes the owner's identity)."""
    stage = "join"
    try:
        me = str(os.getpid())
        for d in plan.get("join") or []:
            _write(os.path.join(d, "cgroup.procs"), me)
        if plan.get("container"):
            stage = "container"
            cs = _container_start()
            cs.enter(plan["container"], owner)
            cs.make_targets(plan["container"])
            stage = "exec"
            for sig in RESET_IN_CHILD:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, ())
            argv = cs.runc_argv(plan["container"])
            os.execve(argv[0], argv, cs.runc_env())
        stage = "tmp"
        if plan.get("tmp"):
            _private_tmp(plan["tmp"], owner)
        stage = "identity"
        if owner is not None:
            os.setgroups([int(g) for g in owner.get("groups") or [owner["gid"]]])
            os.setgid(int(owner["gid"]))
            os.setuid(int(owner["uid"]))
        if plan.get("workdir"):
            stage = "chdir"
            os.chdir(plan["workdir"])
        stage = "exec"
        for sig in RESET_IN_CHILD:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        os.execvpe(command[0], command, os.environ)
    except BaseException as e:  # report to the runner through the pipe, then die
        if stage == "exec" and isinstance(e, FileNotFoundError):
            stage = "notfound"
        if stage == "exec" and plan.get("container"):
            stage = "runc"
        if isinstance(e, _NoIdentity):
            stage = "identity"
        what = getattr(e, "strerror", None) or str(e)
        try:
            os.write(err_w, f"{stage}:{what}".encode()[:4000])
        finally:
            os._exit(NOT_FOUND_EXIT if stage == "notfound" else CANNOT_EXECUTE_EXIT)


def _spawn(command: list[str], owner: dict | None, plan: dict) -> tuple[int, str | None, int]:
    """Fork and execute; (pid, error or None, code). The close-on-exec pipe stays silent when
    the exec succeeded, and says why otherwise (not found, not executable, setuid refused, ...)."""
    err_r, err_w = os.pipe()  # both close-on-exec (PEP 446)
    # Block the signals we survive until the child has reset them: no handler of ours runs in it.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SURVIVE)
    pid = os.fork()
    if pid == 0:
        os.close(err_r)
        _exec_child(command, owner, plan, err_w)
    signal.pthread_sigmask(signal.SIG_SETMASK, old)
    os.close(err_w)
    chunks = []
    while chunk := os.read(err_r, 4096):
        chunks.append(chunk)
    os.close(err_r)
    if not chunks:
        return pid, None, 0
    os.waitpid(pid, 0)
    stage, _, what = b"".join(chunks).decode(errors="replace").partition(":")
    if stage == "notfound":
        return pid, f"cannot execute {command[0]!r}: {what}", NOT_FOUND_EXIT
    if stage == "join":
        return pid, f"cannot enter the rank's cgroup: {what}", CANNOT_EXECUTE_EXIT
    if stage == "chdir":
        who = (owner or {}).get("user", "the plane's account")
        return pid, f"cannot enter the working directory {plan.get('workdir')!r} as {who}: {what}", CANNOT_EXECUTE_EXIT
    if stage == "tmp":
        return pid, f"cannot enter the rank's private /tmp: {what}", CANNOT_EXECUTE_EXIT
    if stage == "container":
        return pid, f"cannot set up the container: {what}", CANNOT_EXECUTE_EXIT
    if stage == "runc":
        return pid, f"cannot execute runc ({(plan.get('container') or {}).get('runc')}): {what}", CANNOT_EXECUTE_EXIT
    if stage == "identity":
        user = (owner or {}).get("user")
        return pid, f"cannot run as {user} (uid {(owner or {}).get('uid')}): {what}", CANNOT_EXECUTE_EXIT
    return pid, f"cannot execute {command[0]!r}: {what}", CANNOT_EXECUTE_EXIT


def _container_start():  # noqa: ANN202  the sibling module, loaded by path (-I -S: no sys.path of ours)
    """`container_start.py` beside this file, loaded once (container mode only)."""
    name = "_trainyard_container_start"
    if name not in sys.modules:
        import importlib.util

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "container_start.py")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _await_container(ctr: dict, runc: int) -> tuple[int, str | None, int]:
    """runc has been executed: wait for it to start the container and leave; (the container's
    process, error or None, code). That process is then the runner's child (a subreaper's
    orphan), so its own exit status is what the runner reaps and records."""
    cs = _container_start()
    status = os.waitpid(runc, 0)[1]
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        try:
            return cs.container_pid(ctr), None, 0
        except (OSError, ValueError) as e:
            error = f"the container started but runc's pid file cannot be read: {e}"
            not_found = False
    else:
        error, not_found = cs.failure(ctr, status)
    cs.delete(ctr)
    return runc, error, NOT_FOUND_EXIT if not_found else CANNOT_EXECUTE_EXIT


# -- after the command ---------------------------------------------------------------------------


def _subtree(d: str) -> list[str]:
    """`d` and every cgroup below it (a container's cgroup is a child of its rank's)."""
    return [root for root, _, _ in os.walk(d)] if os.path.isdir(d) else [d]


def _oom_kills(memory: str | None) -> int:
    """How many processes of the rank the kernel's OOM killer killed (v2 memory.events, v1
    memory.oom_control, which counts at the victim's cgroup: a container's below the rank's);
    0 without a memory cgroup."""
    if not memory:
        return 0
    n = 0
    for d in _subtree(memory):
        for name in ("memory.events", "memory.oom_control"):
            try:
                text = _read(os.path.join(d, name))
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    n += int(value)
            break
    return n


def _pids_refused(events: list[str]) -> int:
    """How many forks the pids limit refused, as the rank's and the node's pids.events count them
    (the larger: v1 and older v2 count at the forking cgroup, v2 since Linux 6.13 at the limit's)."""
    n = 0
    if events:  # the rank's own, and those of the cgroups below it (a container's)
        events = [os.path.join(d, "pids.events") for d in _subtree(os.path.dirname(events[0]))] + list(events[1:])
    for path in events:
        try:
            text = _read(path)
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "max" and value.strip().isdigit():
                n = max(n, int(value))
    return n


def _pids_peak(node: str | None) -> int | None:
    try:
        return int(_read(os.path.join(node, "pids.peak"))) if node else None
    except (OSError, ValueError):
        return None


def _wait_watching_pids(child: int, plan: dict) -> tuple[int, bool]:
    """(the command's wait status, whether the pids limit refused a fork of the rank). A thread
    reads pids.events while the command runs and, at the first refusal, kills the rank's cgroup:
    the command's end then comes as a SIGKILL, and the record says why."""
    import threading

    events = plan["pids_events"]
    hit, over = threading.Event(), threading.Event()

    def watch() -> None:
        while not over.wait(PIDS_POLL_S):
            if _pids_refused(events):
                hit.set()
                _drain_cgroup(plan)
                return

    watcher = threading.Thread(target=watch, name="pids-watch", daemon=True)
    watcher.start()
    status = os.waitpid(child, 0)[1]
    over.set()
    watcher.join()
    return status, hit.is_set() or _pids_refused(events) > 0


def _cgroup_pids(dirs: list[str]) -> set[int]:
    """The processes of the cgroups `dirs` and of every cgroup below them (a container's)."""
    out: set[int] = set()
    for top in dirs:
        for d in _subtree(top):
            try:
                out.update(int(p) for p in _read(os.path.join(d, "cgroup.procs")).split())
            except OSError:
                pass
    return out


def _kill(pids: set[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _drain_cgroup(plan: dict, reap: bool = False) -> None:
    """Kill every process left in the rank's cgroup and wait until it is empty. v2: cgroup.kill;
    v1: freeze, SIGKILL each member, thaw (a frozen process cannot fork meanwhile). `reap`: the
    runner is a subreaper (container mode): the killed orphans are its children to reap."""
    join = plan.get("join") or []
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while _cgroup_pids(join) and time.monotonic() < deadline:
        if reap:
            _reap_all()
        kill_dir, freezer = plan.get("kill"), plan.get("freezer")
        if kill_dir:
            try:
                _write(os.path.join(kill_dir, "cgroup.kill"), "1")
            except OSError:
                _kill(_cgroup_pids(join))
        elif freezer and plan.get("mode") == "cgroup1":
            state = os.path.join(freezer, "freezer.state")
            try:
                _write(state, "FROZEN")
                until = time.monotonic() + 1.0
                while _read(state).strip() != "FROZEN" and time.monotonic() < until:
                    time.sleep(0.005)
                _kill(_cgroup_pids(join))
            finally:
                try:
                    _write(state, "THAWED")
                except OSError:
                    pass
        else:
            _kill(_cgroup_pids(join))
        time.sleep(0.01)
    if reap:
        _reap_all()


def _descendants(root: int) -> set[int]:
    """Every live descendant of `root`, from the parent links of /proc/<pid>/stat."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            raw = _read(f"/proc/{name}/stat")
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        if fields[0] not in ("Z", "X"):
            kids.setdefault(int(fields[1]), []).append(int(name))
    found: set[int] = set()
    todo = list(kids.get(root, ()))
    while todo:
        p = todo.pop()
        if p not in found:
            found.add(p)
            todo.extend(kids.get(p, ()))
    return found


def _drain_descendants() -> None:
    """Subreaper mode: SIGKILL every descendant and reap it until none is left. Orphans are
    re-parented to us, so repeating the walk finds the children of the ones just killed."""
    me = os.getpid()
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        found = _descendants(me)
        _kill(found)
        _reap_all()
        if not found:
            return
        time.sleep(0.005)


def _reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _pass_on(child: int, sig: int) -> None:
    try:
        os.kill(child, sig)
    except ProcessLookupError:  # ended meanwhile
        pass


def _wait_for(child: int, subreaper: bool) -> int:
    """The command's wait status; in subreaper mode adopted orphans are reaped on the way."""
    if not subreaper:
        return os.waitpid(child, 0)[1]  # retried by Python on EINTR (PEP 475)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # cannot happen while the child is unreaped; be safe
            return os.waitpid(child, 0)[1]
        if pid == child:
            return status


def main(argv: list[str], forward: tuple[signal.Signals, ...] = ()) -> int:
    """`forward`: signals the runner passes on to the command's process when it gets them itself,
    for a caller whose signals reach the runner alone (Slurm's `scancel --batch`, sbatch's
    `--signal=B:`, signals the batch step's first process and none of its children)."""
    if len(argv) < 4 or argv[2] != "--":
        print("usage: rank_runner.py <run-dir> <rank> -- <command...>", file=sys.stderr)
        return 2
    run_dir, rank, command = argv[0], int(argv[1]), argv[3:]
    state_path = os.path.join(run_dir, f"rank-{rank}.json")
    exit_path = os.path.join(run_dir, f"rank-{rank}.exit")
    owner, plan = _plan(run_dir, rank)
    subreaper = plan.get("mode") == "subreaper"
    ctr = plan.get("container")  # run in a container (container_start.py); the runner is then a subreaper

    # A handler (not SIG_IGN): handlers fall back to the default on exec, so the command starts
    # with normal dispositions while the runner keeps waiting when the group is signalled.
    for sig in SURVIVE:
        signal.signal(sig, lambda *_: None)
    if subreaper or ctr:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            msg = f"cannot become a child subreaper: {os.strerror(ctypes.get_errno())}"
            print(f"trainyard: {msg}", file=sys.stderr, flush=True)
            _write_json(exit_path, {"exit_code": CANNOT_EXECUTE_EXIT, "signal": None, "error": msg})
            _write_json(state_path, {"pid": os.getpid(), "start_time": _start_time(os.getpid()),
                                     "pgid": os.getpgrp(), "child_pid": None, "error": msg})
            return CANNOT_EXECUTE_EXIT

    me = os.getpid()
    state: dict = {"pid": me, "start_time": _start_time(me), "pgid": os.getpgrp()}
    _reserve(exit_path + ".reserve")
    error: str | None = None
    if ctr:
        try:
            image_lock = _container_start().hold_image(ctr)  # noqa: F841  held until the runner exits
        except _container_start().StartError as e:
            error, child, code = str(e), 0, CANNOT_EXECUTE_EXIT
    if error is None:
        child, error, code = _spawn(command, owner, plan)
        if error is None and ctr:
            child, error, code = _await_container(ctr, child)
    if error is not None:
        print(f"trainyard: {error}", file=sys.stderr, flush=True)
        _write_json(exit_path, {"exit_code": code, "signal": None, "error": error})
        _write_json(state_path, {**state, "child_pid": None, "error": error})
        return code
    for sig in forward:
        signal.signal(sig, lambda signum, _frame: _pass_on(child, signum))
    try:
        _write_json(state_path, {**state, "child_pid": child, "child_start_time": _child_start(child)})
    except OSError:
        # The run dir is gone: the attempt was released while we were starting (an owner died
        # mid-launch and the next one cleaned up). Nothing may run untracked: end it all.
        _drain_descendants() if subreaper else _drain_cgroup(plan, reap=bool(ctr))
        if ctr:
            _container_start().delete(ctr)
        os.killpg(0, signal.SIGKILL)

    pids_hit = False
    if plan.get("pids_events") and not subreaper:
        status, pids_hit = _wait_watching_pids(child, plan)
    else:
        status = _wait_for(child, subreaper or bool(ctr))
    oom = _oom_kills(plan.get("memory"))
    peak = _pids_peak(plan.get("pids_node"))
    if subreaper:
        _drain_descendants()
    elif plan.get("join"):
        _drain_cgroup(plan, reap=bool(ctr))
    if ctr:  # the container's state and its cgroups below the rank's go
        if complaint := _container_start().delete(ctr):
            print(f"trainyard: runc delete {ctr['id']}: {complaint}", file=sys.stderr, flush=True)
    if os.WIFSIGNALED(status):
        record = {"exit_code": None, "signal": os.WTERMSIG(status)}
        rc = 128 + os.WTERMSIG(status)
    else:
        record = {"exit_code": os.WEXITSTATUS(status), "signal": None}
        rc = os.WEXITSTATUS(status)
    record["oom_killed"] = oom > 0
    if plan.get("pids_max"):
        record.update(pids_max_hit=pids_hit, pids_max=plan["pids_max"], pids_peak=peak)
    _record_exit(exit_path, record)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
