"""The `yard` command (entry point `trainyard.cli.main:app`).

Command groups live in their own modules and are wired here:
- `yard sim` (`cli/sim.py`): simulate a workload under each policy, write a report;
- `yard plan capacity` (`cli/plan.py`): smallest cluster meeting a wait target, by simulation;
- `yard bench sched` (`cli/bench.py`): time scheduling cycles on a synthetic snapshot.

Bad arguments or input: one line `error: …` on stderr and exit code 2 (`cli/common.py`).
"""

from __future__ import annotations

import typer

from trainyard.cli import bench, plan
from trainyard.cli import sim as sim_cmd

app = typer.Typer(help="trainyard: a manager for GPU training clusters shared by several teams.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)


@app.callback()
def _main() -> None:
    """trainyard: a manager for GPU training clusters shared by several teams."""


app.command("sim")(sim_cmd.sim)
app.add_typer(plan.app, name="plan")
app.add_typer(bench.app, name="bench")


def main() -> None:  # `python -m trainyard.cli.main`
    app()


if __name__ == "__main__":
    main()
