"""Rank runner: the small parent of one rank's command that outlives the control plane.

Usage: python -I -S rank_runner.py <run-dir> <rank> -- <command...>

Why it exists: a process's exit status can only be collected by its parent. If the control plane
were the parent and got killed, a rank ending afterwards would leave no trace of how it ended. So
the local backend starts this runner (in a new session: it is the process-group leader) and the
runner starts the command as its child in the same group. The runner

1. writes `<run-dir>/rank-<r>.json` = {pid, start_time, pgid, child_pid} (or `error` when the
   command cannot be executed), which tells the backend the rank is up and lets a later control
   plane find it and check the pid was not recycled;
2. survives the signals the control loop sends to the group (SIGUSR1 preemption notice, SIGTERM,
   ...): they reach the command directly, the runner only keeps waiting;
3. writes `<run-dir>/rank-<r>.exit` = {exit_code, signal} atomically when the command ends.

SIGKILL of the group kills the runner too; then no exit file is written and the backend reports
the rank as killed (if it watched) or lost (if nobody did). A command that cannot be executed is
recorded as exit code 127 (not found) or 126 (not executable), like a shell, and the launch fails.

The runner is run by path with `-I -S` and imports only the standard library, so it starts fast
and nothing in the job's workdir, PYTHONPATH or site-packages can change its behaviour.
"""

from __future__ import annotations

import json
import os
import signal
import sys

# Signals the runner itself must survive (the group gets them, the command acts on them).
SURVIVE = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
# Python ignores SIGPIPE/SIGXFSZ at start-up; an ignored disposition survives exec, so reset it.
RESET_IN_CHILD = SURVIVE + (signal.SIGPIPE, signal.SIGXFSZ)


def _start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read().decode(errors="replace")
    return int(raw[raw.rindex(")") + 2 :].split()[19])


def _write_json(path: str, obj: dict) -> None:
    """Write atomically: a reader sees the old state or the whole new one, never half a file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: rank_runner.py <run-dir> <rank> -- <command...>", file=sys.stderr)
        return 2
    run_dir, rank, command = argv[0], int(argv[1]), argv[3:]
    state_path = os.path.join(run_dir, f"rank-{rank}.json")
    exit_path = os.path.join(run_dir, f"rank-{rank}.exit")

    # A handler (not SIG_IGN): handlers fall back to the default on exec, so the command starts
    # with normal dispositions while the runner keeps waiting when the group is signalled.
    for sig in SURVIVE:
        signal.signal(sig, lambda *_: None)

    me = os.getpid()
    state: dict = {"pid": me, "start_time": _start_time(me), "pgid": os.getpgrp()}
    try:
        child = os.posix_spawnp(
            command[0], command, dict(os.environ), setsigmask=(), setsigdef=RESET_IN_CHILD
        )
    except OSError as e:
        code = 127 if isinstance(e, FileNotFoundError) else 126
        msg = f"cannot execute {command[0]!r}: {e.strerror}"
        print(f"trainyard: {msg}", file=sys.stderr, flush=True)
        _write_json(exit_path, {"exit_code": code, "signal": None, "error": msg})
        _write_json(state_path, {**state, "child_pid": None, "error": msg})
        return code
    try:
        _write_json(state_path, {**state, "child_pid": child})
    except OSError:
        # The run dir is gone: the attempt was released while we were starting (an owner died
        # mid-launch and the next one cleaned up). Nothing may run untracked: end the group.
        os.killpg(0, signal.SIGKILL)

    _, status = os.waitpid(child, 0)  # retried by Python on EINTR (PEP 475)
    if os.WIFSIGNALED(status):
        record = {"exit_code": None, "signal": os.WTERMSIG(status)}
        rc = 128 + os.WTERMSIG(status)
    else:
        record = {"exit_code": os.WEXITSTATUS(status), "signal": None}
        rc = os.WEXITSTATUS(status)
    _write_json(exit_path, record)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
