"""Run one command (a test cluster's slurmd) as the only child of a child subreaper.

    python -I -S tests/slurm_subreaper.py slurmd -D -f slurm.conf -N n1

Why: slurmd daemonizes each slurmstepd, and `srun` leaves an orphaned child behind when it ends;
orphans go to the nearest subreaper ancestor, or to PID 1. On this project's machines PID 1 is
not an init that reaps promptly, so the orphan stays a zombie in the batch step's process group,
and `proctrack/pgid` waits for that group to empty with 1 s, then 2 s sleeps: every batch job that
ran an `srun` step took 3.0 s from its batch script's exit to its end in slurmctld (its GPUs held
meanwhile), against 0.01 s without the zombie. On a real node systemd reaps it at once; here this
process does (PR_SET_CHILD_SUBREAPER: the orphans of everything below it are reparented to it).

Signals: SIGTERM, SIGINT, SIGHUP, SIGUSR1/2 are passed on to the command; if this process dies
(even by SIGKILL, as `SlurmCluster.kill_slurmd` does), the command gets SIGKILL (PR_SET_PDEATHSIG),
so killing this process still kills slurmd at once and leaves its steps running. Exits with the
command's exit status once the command has ended; orphans still running then go to PID 1.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: slurm_subreaper.py COMMAND [ARG...]", file=sys.stderr)
        return 2
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"slurm_subreaper: prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}", file=sys.stderr)
    child = os.fork()
    if child == 0:
        try:
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() == 1:  # the subreaper died between fork and prctl
                os._exit(1)
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)

    def forward(sig: int, _frame: object) -> None:
        try:
            os.kill(child, sig)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    while True:
        try:
            pid, status = os.wait()  # the command, or any orphan reparented here
        except ChildProcessError:
            return 1
        if pid == child:
            return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
