"""The conformance suite's rank program for real backends: the fake backend's program language
(`trainyard.backends.fake`), carried out by a real process. Standard library only (it runs on
Slurm nodes as it runs here).

Usage: python rank_program.py [TOKEN ...]   with the tokens

    run=T        exit after T seconds (default: run until signalled or gated)
    exit=N       exit code then (default 0)
    usr1=D       on SIGUSR1: exit 75 D seconds later (default: SIGUSR1 kills it, signal 10);
                 usr1=ignore: carries on
    term=ignore  ignore SIGTERM; term=D: treat it like SIGUSR1 (default: SIGTERM kills it)
    until=PATH   exit (with `exit`) once PATH exists
    rankN:KEY=V  the same for rank N only

With $CONFORMANCE_OUT set, it first writes its environment (and `_ROOT_DEV`, the device of its
root file system) to `$CONFORMANCE_OUT/env-<job>-<attempt>-<rank>.json`, then, once its handlers are installed,
`ready-<job>-<attempt>-<rank>`: a test signals the ranks only after that.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def main(argv: list[str]) -> int:
    rank = int(os.environ["RANK"])
    base: dict[str, str] = {}
    mine: dict[str, str] = {}
    for tok in argv:
        key, _, value = tok.partition("=")
        if key.startswith("rank") and ":" in key:
            head, key = key.split(":", 1)
            if int(head[4:]) == rank:
                mine[key] = value
        else:
            base[key] = value
    prog = {**base, **mine}
    unknown = set(prog) - {"run", "exit", "usr1", "term", "until"}
    if unknown:
        print(f"rank_program: unknown tokens {sorted(unknown)}", file=sys.stderr)
        return 2
    state: dict[str, object] = {"deadline": time.monotonic() + float(prog["run"]) if "run" in prog else None,
                                "code": int(prog.get("exit", 0)), "noticed": False}

    def notice_after(seconds: float):  # noqa: ANN202
        def handler(*_: object) -> None:
            due = time.monotonic() + seconds
            deadline = state["deadline"]
            if state["noticed"]:
                state["deadline"] = min(deadline, due)  # type: ignore[type-var]
            elif deadline is None or due < deadline:  # type: ignore[operator]
                state.update(deadline=due, code=75, noticed=True)
        return handler

    if prog.get("usr1") == "ignore":
        signal.signal(signal.SIGUSR1, lambda *_: None)  # a handler that notes the notice and carries on
    elif "usr1" in prog:
        signal.signal(signal.SIGUSR1, notice_after(float(prog["usr1"])))
    term = prog.get("term", "die")
    if term == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif term != "die":
        signal.signal(signal.SIGTERM, notice_after(float(term)))

    out = os.environ.get("CONFORMANCE_OUT")
    if out:
        name = f"{os.environ.get('TRAINYARD_JOB_ID')}-{os.environ.get('TRAINYARD_ATTEMPT')}-{rank}"
        tmp = os.path.join(out, f".env-{name}.{os.getpid()}")
        with open(tmp, "w") as f:  # and the device of its `/`: a container's is not the host's
            json.dump({**os.environ, "_ROOT_DEV": str(os.stat("/").st_dev)}, f)
        os.replace(tmp, os.path.join(out, f"env-{name}.json"))
        open(os.path.join(out, f"ready-{name}"), "w").close()
    until = prog.get("until")
    while True:
        deadline = state["deadline"]
        if (until and os.path.exists(until)) or (deadline is not None and time.monotonic() >= deadline):  # type: ignore[operator]
            return int(state["code"])  # type: ignore[call-overload]
        time.sleep(0.02)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
