"""The `yard` command (entry point `trainyard.cli.main:app`).

Command groups live in their own modules and are wired here:
- `yard sim` (`cli/sim.py`): simulate a workload under each policy, write a report;
- `yard trace fetch|list|export` (`cli/trace.py`): the public traces it replays, downloaded and verified,
  and the cluster's own history as a trace;
- `yard plan capacity` (`cli/plan.py`): smallest cluster meeting a wait target, by simulation;
- `yard bench sched` (`cli/bench.py`): time scheduling cycles on a synthetic snapshot;
- `yard up` (`cli/up.py`): the control plane (API, store, control loop, local backend);
- job commands (`cli/jobs.py`): submit, queue, show, cancel, hold, release, requeue, logs, events;
- cluster commands (`cli/admin.py`): nodes, drain, resume, teams, cluster (its `pilot`: `cli/pilot.py`); tokens (`cli/tokens.py`): create, list, revoke;
  login, logout, whoami (`cli/login.py`): the Unix account as identity, one-time codes;
  reservations (`cli/reservations.py`): create, list, delete;
- accounting: acct (sacct, `cli/acct.py`), report (sreport, `cli/report.py`), share and prio (sshare,
  sprio, `cli/share.py`), audit (the audit trail as JSON lines, `cli/audit.py`);
- storage (`cli/storage.py`): the disk job dirs take per team, against quotas and the reserve;
  checkpoints (`cli/checkpoints.py`): a job's checkpoints in each tier, keep marks;
- image pull|ls|rm (`cli/images.py`): the nodes' image caches;
- dataset add|ls|show|grant|checksum|stage (`cli/dataset.py`, `cli/dataset_stage.py`): the dataset catalogue, what the nodes' caches hold, pre-staging;
- shell (`cli/shell.py`): a terminal in a running job's rank, through the API's WebSocket;
  alloc (salloc, `cli/alloc.py`) and srun --pty (`cli/srun_cmd.py`): an interactive allocation and its session;
  notebook (`cli/notebook.py`): JupyterLab in an allocation, on a local URL through a forwarded port;
  port-forward (`cli/port_forward.py`): a local port tunnelled to a port inside a running job.

- recipes: run (train on this machine, `cli/run.py`), export (a run as a Hugging Face model,
  `cli/model_export.py`), models (the exported models and their lineage, `cli/models.py`).

Bad arguments or input: one line `error: …` on stderr and exit code 2 (`cli/common.py`).
"""

from __future__ import annotations

import typer

from trainyard.cli import (acct, admin, audit, bench, chaos, checkpoints, dataset, images, jobs, model_export, models, plan, report, reservations, run,
                           share, storage, tboard, tokens, up)
from trainyard.cli import login as login_cmd
from trainyard.cli import trace as trace_cmd
from trainyard.cli import sim as sim_cmd
from trainyard.cli import shell as shell_cmd
from trainyard.cli import alloc as alloc_cmd
from trainyard.cli import srun_cmd
from trainyard.cli import notebook as notebook_cmd
from trainyard.cli import port_forward
from trainyard.cli import pilot
from trainyard.cli.strict import CONTEXT, StrictCommand

app = typer.Typer(help="trainyard: a manager for GPU training clusters shared by several teams.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)


def _version(value: bool) -> None:
    if value:  # as `sbatch --version`: the name and the version, then nothing else runs
        from trainyard import __version__

        typer.echo(f"trainyard {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """trainyard: a manager for GPU training clusters shared by several teams."""


app.command("sim")(sim_cmd.sim)
app.add_typer(trace_cmd.app, name="trace")
app.add_typer(plan.app, name="plan")
app.add_typer(bench.app, name="bench")
app.command("up")(up.up)
app.command("demo")(up.demo)
app.command("submit", cls=StrictCommand, context_settings=CONTEXT)(jobs.submit)
for _name in ("queue", "show", "cancel", "hold", "release", "requeue", "logs", "events"):
    app.command(_name)(getattr(jobs, _name))
for _name in ("nodes", "drain", "resume"):
    app.command(_name)(getattr(admin, _name))
app.add_typer(admin.teams_app, name="teams")
admin.cluster_app.add_typer(pilot.pilot_app, name="pilot")
app.add_typer(admin.cluster_app, name="cluster")
app.add_typer(tokens.token_app, name="token")
app.add_typer(login_cmd.login_app, name="login")  # login, logout, whoami: cli/login.py
app.command("logout")(login_cmd.logout)
app.command("whoami")(login_cmd.whoami)
app.add_typer(reservations.app, name="reservation")
app.add_typer(images.app, name="image")
app.add_typer(dataset.app, name="dataset")
app.command("acct")(acct.acct)
app.command("report")(report.report)
app.command("storage")(storage.storage)
app.command("checkpoints")(checkpoints.checkpoints)
app.command("share")(share.share)
app.command("prio")(share.prio)
app.command("audit")(audit.audit)
app.command("run")(run.run)
app.command("export")(model_export.export)
app.command("models")(models.models)
app.command("chaos")(chaos.chaos)
app.command("tensorboard")(tboard.tensorboard)
app.command("shell")(shell_cmd.shell)
app.command("alloc", cls=StrictCommand, context_settings=CONTEXT)(alloc_cmd.alloc)
app.command("srun", cls=StrictCommand, context_settings=CONTEXT)(srun_cmd.srun)
app.command("notebook", cls=StrictCommand)(notebook_cmd.notebook)
app.command("port-forward")(port_forward.port_forward)


def main() -> None:  # `python -m trainyard.cli.main`
    app()


if __name__ == "__main__":
    main()
