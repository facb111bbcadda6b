"""One rank of a recipe: `python -m trainyard.recipes RECIPE [--set key=value …]`.

The rank reads its place and directories from the job environment (RANK, WORLD_SIZE,
MASTER_ADDR/PORT, TRAINYARD_CHECKPOINT_DIR, TRAINYARD_METRICS_DIR; docs/design.md), so the same
command runs under `yard run`, under the control plane (`yard submit --recipe`), under plain
`torchrun`, or alone. Exit codes: 0 done, 75 checkpointed after a preemption notice, 2 bad recipe
(`error: …` naming the field), 1 any other failure.

A notice (SIGUSR1/SIGTERM) that arrives while the rank is still importing torch or building the
model is remembered and handed to the runtime once it is up: the rank then checkpoints at its
first step boundary and exits 75 instead of dying of the signal's default action.
"""

from __future__ import annotations

import signal

from trainyard.contracts import PREEMPT_SIGNALS  # standard library only: the handlers go in before torch loads

_notices: list[int] = []


def _early_notice(signum: int, frame: object) -> None:
    _notices.append(signum)


for _sig in PREEMPT_SIGNALS:
    signal.signal(_sig, _early_notice)

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

from trainyard.recipes.spec import RecipeError, load_recipe  # noqa: E402

EXIT_BAD_INPUT = 2


def _exit(code: int) -> None:
    """Flush and leave without interpreter teardown: with FSDP2 on gloo, torch 2.13 sometimes
    aborts in C++ destructors at exit after everything finished (see tests/runtime/fsdp_script.py)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainyard.recipes",
                                 description="Run one rank of a training recipe (job environment from the contract).")
    ap.add_argument("recipe", help="a shipped recipe name or a path to a YAML file")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override a recipe field (dotted keys, e.g. model.hidden_size=64); repeatable")
    a = ap.parse_args(argv)
    try:
        spec = load_recipe(a.recipe, a.sets)
        spec.check_world_size(int(os.environ.get("WORLD_SIZE", "1") or 1))
    except (RecipeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from trainyard.recipes.train import main as train

    try:
        return train(spec, early_notice=lambda: bool(_notices))
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except SystemExit as e:  # the runtime's exit 75 after a preemption checkpoint
        return e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - a crash: the traceback, then exit 1
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    _exit(main())
