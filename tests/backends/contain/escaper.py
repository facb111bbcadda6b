"""A rank program that tries every way out of its process group: run as
`python escaper.py <out-dir> <exit-code|wait>`.

It starts (1) `setsid sleep 3600 &` through a shell, (2) a classic double-forked daemon (fork,
setsid, fork, the middle one exits, the grandchild lives on with parent 1 or a subreaper), each
of which writes its pid to <out-dir>/pids and, on SIGUSR1, a file <out-dir>/usr1-<pid>. Then it
writes <out-dir>/ready and exits with the code given, or waits ("wait").
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

out = sys.argv[1]


def note(pid: int) -> None:
    with open(os.path.join(out, "pids"), "a") as f:
        f.write(f"{pid}\n")


def usr1_marker(*_: object) -> None:
    open(os.path.join(out, f"usr1-{os.getpid()}"), "w").close()


def lives_on() -> None:
    signal.signal(signal.SIGUSR1, usr1_marker)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stubborn one: only SIGKILL ends it
    note(os.getpid())
    while True:
        time.sleep(1)


# (1) setsid sleep in the background, as a shell script would do it
sh = subprocess.run(["sh", "-c", "setsid sleep 3600 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
note(int(sh.stdout.split()[0]))

# (2) the double-forked daemon
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        lives_on()
    os._exit(0)
os.wait()

deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    with open(os.path.join(out, "pids")) as f:
        if len(f.read().split()) >= 2:
            break
    time.sleep(0.01)
signal.signal(signal.SIGUSR1, usr1_marker)
open(os.path.join(out, "ready"), "w").close()
if sys.argv[2] == "wait":
    while True:
        time.sleep(1)
sys.exit(int(sys.argv[2]))
