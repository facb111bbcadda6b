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

Each command is one line of COMMANDS below; its module loads only when it runs (`cli/lazy.py`).
"""

from __future__ import annotations

import typer

from trainyard.cli.lazy import Lazy, lazy_group
from trainyard.cli.strict import CONTEXT, StrictCommand

STRICT = {"cls": StrictCommand, "context_settings": CONTEXT}  # long options never abbreviated, `--` kept

# Every command: its name, then "module:attribute" under trainyard.cli (a function is a command, a
# typer.Typer a group). A module loads only when its command runs or a help lists it (cli/lazy.py).
# The order is `yard --help`'s.
COMMANDS: dict[str, Lazy] = {
    "sim": Lazy("sim:sim"),
    "up": Lazy("up:up"),
    "demo": Lazy("up:demo"),
    "submit": Lazy("jobs:submit", STRICT),
    "queue": Lazy("jobs:queue"),
    "show": Lazy("jobs:show"),
    "cancel": Lazy("jobs:cancel"),
    "hold": Lazy("jobs:hold"),
    "release": Lazy("jobs:release"),
    "requeue": Lazy("jobs:requeue"),
    "logs": Lazy("jobs:logs"),
    "events": Lazy("jobs:events"),
    "nodes": Lazy("admin:nodes"),
    "drain": Lazy("admin:drain"),
    "resume": Lazy("admin:resume"),
    "logout": Lazy("login:logout"),
    "whoami": Lazy("login:whoami"),
    "acct": Lazy("acct:acct"),
    "report": Lazy("report:report"),
    "storage": Lazy("storage:storage"),
    "checkpoints": Lazy("checkpoints:checkpoints"),
    "share": Lazy("share:share"),
    "prio": Lazy("share:prio"),
    "audit": Lazy("audit:audit"),
    "run": Lazy("run:run"),
    "export": Lazy("model_export:export"),
    "models": Lazy("models:models"),
    "chaos": Lazy("chaos:chaos"),
    "tensorboard": Lazy("tboard:tensorboard"),
    "shell": Lazy("shell:shell"),
    "alloc": Lazy("alloc:alloc", STRICT),
    "srun": Lazy("srun_cmd:srun", STRICT),
    "notebook": Lazy("notebook:notebook", {"cls": StrictCommand}),
    "port-forward": Lazy("port_forward:port_forward"),
    "trace": Lazy("trace:app"),
    "plan": Lazy("plan:app"),
    "bench": Lazy("bench:app"),
    "teams": Lazy("admin:teams_app"),
    "cluster": Lazy("admin:cluster_app"),  # with its `pilot` group (cli/pilot.py)
    "token": Lazy("tokens:token_app"),
    "login": Lazy("login:login_app"),  # login; logout and whoami above
    "reservation": Lazy("reservations:app"),
    "image": Lazy("images:app"),
    "dataset": Lazy("dataset:app"),
}

app = typer.Typer(help="trainyard: a manager for GPU training clusters shared by several teams.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
                  cls=lazy_group(COMMANDS))


def _version(value: bool) -> None:
    if value:  # as `sbatch --version`: the name and the version, then nothing else runs
        from trainyard import __version__

        typer.echo(f"trainyard {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """trainyard: a manager for GPU training clusters shared by several teams."""


def main() -> None:  # `python -m trainyard.cli.main`
    app()


if __name__ == "__main__":
    main()
