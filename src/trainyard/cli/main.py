"""The `yard` command (entry point `trainyard.cli.main:app`).

Command groups live in their own modules and are wired here:
- `yard sim` (`cli/sim.py`): simulate a workload under each policy, write a report;
- `yard plan capacity` (`cli/plan.py`): smallest cluster meeting a wait target, by simulation;
- `yard bench sched` (`cli/bench.py`): time scheduling cycles on a synthetic snapshot;
- `yard up` (`cli/up.py`): the control plane (API, store, control loop, local backend);
- job commands (`cli/jobs.py`): submit, queue, show, cancel, hold, release, requeue, logs, events;
- cluster commands (`cli/admin.py`): nodes, drain, resume, teams, cluster, token.

Bad arguments or input: one line `error: …` on stderr and exit code 2 (`cli/common.py`).
"""

from __future__ import annotations

import typer

from trainyard.cli import admin, bench, chaos, jobs, plan, run, tboard, up
from trainyard.cli import sim as sim_cmd

app = typer.Typer(help="trainyard: a manager for GPU training clusters shared by several teams.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)


@app.callback()
def _main() -> None:
    """trainyard: a manager for GPU training clusters shared by several teams."""


app.command("sim")(sim_cmd.sim)
app.add_typer(plan.app, name="plan")
app.add_typer(bench.app, name="bench")
app.command("up")(up.up)
app.command("demo")(up.demo)
app.command("submit", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(jobs.submit)
for _name in ("queue", "show", "cancel", "hold", "release", "requeue", "logs", "events"):
    app.command(_name)(getattr(jobs, _name))
for _name in ("nodes", "drain", "resume"):
    app.command(_name)(getattr(admin, _name))
app.add_typer(admin.teams_app, name="teams")
app.add_typer(admin.cluster_app, name="cluster")
app.add_typer(admin.token_app, name="token")
app.command("run")(run.run)
app.command("chaos")(chaos.chaos)
app.command("tensorboard")(tboard.tensorboard)


def main() -> None:  # `python -m trainyard.cli.main`
    app()


if __name__ == "__main__":
    main()
