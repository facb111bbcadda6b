"""Job commands, for people used to Slurm: submit (sbatch), queue (squeue), show (scontrol show
job), cancel (scancel), hold / release / requeue (scontrol), logs, events."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer

from trainyard.cli import container_opts, dataset_opts, event_format, image_view, queue_format, recorded
from trainyard.cli.client import Client
from trainyard.cli.columns import terminal_width
from trainyard.cli.common import EXIT_BAD_INPUT, fail
from trainyard.cli.export import ExportError, job_env, parse_export
from trainyard.cli.render import clock, duration, gpu_indices, nodelist, print_json, table
from trainyard.cli.safe_text import clean
from trainyard.cli.shared_options import with_options
from trainyard.cli.strict import AFTER_DASHDASH
from trainyard.spec import io_patterns
from trainyard.cli.sbatch import SbatchError, gpu_spec, open_mode, parse_sbatch, slurm_time
from trainyard.spec.mail_types import check_mail_user, parse_mail_type
from trainyard.contracts import expand_hostlist
from trainyard.sched.constraints import ConstraintError, parse_features
from trainyard.spec.parsing import parse_begin, parse_mem_mib
from trainyard.spec.signals import parse_signal
from trainyard.states import TERMINAL_STATES

JSON = typer.Option(False, "--json", help="print JSON instead of a table")
SCRIPT_SUFFIXES = (".sh", ".sbatch", ".slurm", ".bash")


def _check_recipe_dataset(path: str | None, asked: list[str]) -> None:
    """A recipe's `data.path: $TRAINYARD_DATASET_<NAME>` is the copy of a dataset the job must ask
    for (`--dataset`): the ranks find nothing there otherwise. Exit 2 naming data.path when it does not."""
    from trainyard.recipes.data_sources import dataset_variable
    from trainyard.staging.types import dataset_var

    from trainyard.recipes.spec import DATASET_PATH_PREFIXES

    var = dataset_variable(path) if path is not None else None
    if var is None and path is not None and path.startswith(DATASET_PATH_PREFIXES):
        fail(f"data.path: {path} does not name a dataset's variable: $TRAINYARD_DATASET_ and the name upper-cased, "
             "'-' as '_' (e.g. $TRAINYARD_DATASET_MY_CORPUS for my-corpus), alone or followed by /PATH")
    if var is None or var in {dataset_var(a.split(":", 1)[0]) for a in asked}:
        return
    name = var.removeprefix("TRAINYARD_DATASET_").lower().replace("_", "-")
    given = f" (it asks for {', '.join(asked)})" if asked else ""
    fail(f"data.path: {path} is the copy of a catalogue dataset, but the job asks for none named by ${var}{given}; "
         f"add --dataset {name}[:VERSION]")


def _looks_like_script(args: list[str]) -> bool:
    if len(args) != 1:
        return False
    p = Path(args[0])
    if p.suffix in SCRIPT_SUFFIXES:
        return True
    try:
        with open(p, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return head.startswith(b"#!") or b"#SBATCH" in head


def job_request(
    args: list[str], after_dashdash: bool, interactive: Optional[dict[str, Any]],
    nodes: Optional[str] = typer.Option(None, "-N", "--nodes", help="nodes: a number or a range MIN-MAX (elastic)"),
    gpus_per_node: Optional[str] = typer.Option(None, "--gpus-per-node", help="GPUs on each node: N or TYPE:N "
                                                "(a GPU model, e.g. a100:4: only nodes of that model)"),
    gpus: Optional[str] = typer.Option(None, "-G", "--gpus", help="total GPUs (anywhere, or divided over --nodes): "
                                       "N or TYPE:N"),
    constraint: Optional[str] = typer.Option(None, "-C", "--constraint", help="node features, as sbatch: ib, "
                                             "ib&nvme, a100|h100, (a|b)&c"),
    nodelist: Optional[str] = typer.Option(None, "-w", "--nodelist", help="nodes the job must include: node-[0-1]"),
    exclude: Optional[str] = typer.Option(None, "-x", "--exclude", help="nodes the job must not use: node-3"),
    exclusive: bool = typer.Option(False, "--exclusive", help="whole nodes: no other job on them; holds (and is "
                                   "charged for) every GPU of each"),
    ntasks: Optional[int] = typer.Option(None, "-n", "--ntasks", help="total tasks, as sbatch (with -N M: N/M per node)"),
    gpu_mem: Optional[float] = typer.Option(None, "--gpu-mem", help="GB of GPU memory needed on each GPU (shares GPUs)"),
    time_limit: Optional[str] = typer.Option(None, "-t", "--time", help="time limit, as sbatch: minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]], "
                                                      "or 30m / 2h; UNLIMITED, INFINITE or 0: the class's max run time"),
    team: Optional[str] = typer.Option(None, "-A", "--team", "--account", help="team (default: your token's)"),
    job_class: Optional[str] = typer.Option(None, "-q", "--class", "--qos",
                                            help="class (Slurm's QOS, also -q/--qos in #SBATCH): interactive, "
                                                 "training, batch"),
    name: Optional[str] = typer.Option(None, "-J", "--name", "--job-name", help="job name"),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="also link the log here, as sbatch (%j id, %t rank, "
                                         "%x name, %u user, %N node, %A/%a array; stdout and stderr unless -e)"),
    error: Optional[str] = typer.Option(None, "-e", "--error", help="stderr apart from stdout, linked here, as sbatch "
                                        "(the same patterns as --output)"),
    open_mode_: Optional[str] = typer.Option(None, "--open-mode", help="as sbatch: append (default: a new attempt "
                                             "keeps the earlier ones' output) or truncate (each attempt starts empty)"),
    mail_type: Optional[str] = typer.Option(None, "--mail-type", help="as sbatch: BEGIN, END, FAIL, REQUEUE, ALL, "
                                            "TIME_LIMIT, TIME_LIMIT_90/80/50, ... (comma-separated), posted to the "
                                            "cluster's webhook (notify: in its configuration)"),
    mail_user: Optional[str] = typer.Option(None, "--mail-user", help="who --mail-type's messages are for "
                                            "(default: you)"),
    tasks_per_node: Optional[int] = typer.Option(None, "--ntasks-per-node", help="ranks per node (default: one per GPU)"),
    mem: Optional[str] = typer.Option(None, "--mem", help="memory per node for all the job's ranks there, as sbatch: "
                                      "16G, 500M, a number of MB; the kernel ends a job over it (state OUT_OF_MEMORY)"),
    mem_per_gpu: Optional[str] = typer.Option(None, "--mem-per-gpu", help="memory per GPU, as sbatch (not with --mem)"),
    mem_per_cpu: Optional[str] = typer.Option(None, "--mem-per-cpu", help="memory per CPU, as sbatch: the node's "
                                              "limit is it times the CPUs of the job's tasks there (not with --mem)"),
    gres: Optional[str] = typer.Option(None, "--gres", help="as sbatch: gpu:N or gpu:TYPE:N (GPUs on each node), "
                                       "or none"),
    gpus_per_task: Optional[str] = typer.Option(None, "--gpus-per-task", help="GPUs of each task, as sbatch: the "
                                                "job's GPUs are its tasks (-n, --ntasks-per-node) times N"),
    wrap: Optional[str] = typer.Option(None, "--wrap", help="as sbatch: run this shell command as the batch script "
                                       "(#!/bin/sh)"),
    hint: Optional[str] = typer.Option(None, "--hint", help="as sbatch (compute_bound, memory_bound, [no]multithread): "
                                       "recorded, SLURM_HINT"),
    distribution: Optional[str] = typer.Option(None, "-m", "--distribution", help="as sbatch (block, cyclic, ...): "
                                               "recorded, SLURM_DISTRIBUTION"),
    gres_flags: Optional[str] = typer.Option(None, "--gres-flags", help="as sbatch: recorded, SLURM_GRES_FLAGS"),
    tmp: Optional[str] = typer.Option(None, "--tmp", help="as sbatch: temporary disk per node, recorded"),
    get_user_env: bool = typer.Option(False, "--get-user-env", help="as sbatch: the job gets your environment "
                                      "(--export=ALL, the default); recorded, SLURM_GET_USER_ENV"),
    threads_per_core: Optional[str] = typer.Option(None, "--threads-per-core", help="as sbatch: recorded, "
                                                   "SLURM_THREADS_PER_CORE"),
    wckey: Optional[str] = typer.Option(None, "--wckey", help="as sbatch: recorded, SLURM_WCKEY"),
    cpus_per_task: Optional[int] = typer.Option(None, "-c", "--cpus-per-task", help="CPUs per rank, as sbatch"),
    checkpoint_interval: Optional[str] = typer.Option(None, "--checkpoint-interval", help="how often the job checkpoints"),
    pool: Optional[str] = typer.Option(None, "-p", "--pool", "--partition", help="pool of nodes"),
    workdir: Optional[str] = typer.Option(None, "-D", "--chdir", help="working directory (default: here)"),
    env: list[str] = typer.Option([], "--env", help="KEY=VALUE for the job's environment (repeatable; long form only: "
                                  "-e is --error, as in sbatch)"),
    notice: Optional[str] = typer.Option(None, "--signal",
                                         help="as sbatch: [B:]SIG[@secs], SIG sent secs (60) before the time limit, "
                                              "e.g. USR1@120, so the job checkpoints before it is stopped"),
    export: Optional[str] = typer.Option(None, "--export",
                                         help="your shell's environment for the job, as sbatch: ALL (default), NONE, "
                                              "VAR1,VAR2 (only those), ALL,VAR=value"),
    _requeue: bool = typer.Option(False, "--requeue", help="requeue when preempted or its node is lost: every job's "
                                                       "default (--no-requeue is refused)"),
    hold: bool = typer.Option(False, "-H", "--hold", help="submit held; `yard release` lets it run"),
    dependency: Optional[str] = typer.Option(None, "-d", "--dependency",
                                             help="wait for other jobs, as sbatch: afterok:12[:13], afterany:12, "
                                                  "afternotok:12, after:12, singleton; ',' joins parts"),
    begin: Optional[str] = typer.Option(None, "-b", "--begin",
                                        help="not before this time, as sbatch: now+1hour, now+30minutes, 16:00, "
                                             "2026-12-24T08:00, midnight"),
    array: Optional[str] = typer.Option(None, "-a", "--array",
                                        help="a job array, as sbatch: 0-9, 1,3,5, 0-15:4, 0-99%8 (at most 8 at once); "
                                             "each task sees $SLURM_ARRAY_TASK_ID"),
    reservation: Optional[str] = typer.Option(None, "--reservation",
                                              help="run in this admin reservation (yard reservation list), on its "
                                                   "nodes while it is active"),
    recipe: Optional[str] = typer.Option(None, "--recipe", help="a training recipe (llama-pretrain, gemma-pretrain, "
                                         "sft, rl, or a YAML file) instead of a command"),
    sets: list[str] = typer.Option([], "--set", help="with --recipe: override a recipe field, KEY=VALUE (repeatable)"),
    dataset: list[str] = typer.Option([], "--dataset", help="datasets of the catalogue (yard dataset ls), "
                                      "NAME[:VERSION][,NAME[:VERSION]...], repeatable: each staged on every node of "
                                      "the job before it starts, at $TRAINYARD_DATASET_<NAME> (no version: the newest "
                                      "your team may use)"),
    c_image: Optional[str] = typer.Option(None, "--container-image", help="run in this image, as pyxis: "
                                          "[USER@][REGISTRY#]IMAGE[:TAG|@sha256:...] or REGISTRY/IMAGE[:TAG] "
                                          "(default: your team's image, if the cluster names one)"),
    c_mounts: Optional[str] = typer.Option(None, "--container-mounts", help="as pyxis: SRC[:DST[:FLAGS]],... "
                                           "host paths bound into the container (FLAGS: ro, rprivate, ... joined by +)"),
    c_workdir: Optional[str] = typer.Option(None, "--container-workdir", help="as pyxis: the working directory "
                                            "inside the container (default: the job's, mounted at its own path)"),
    c_env: Optional[str] = typer.Option(None, "--container-env", help="as pyxis: NAME[,NAME...], variables whose "
                                        "value from the job's environment wins over the image's"),
    c_home: Optional[bool] = typer.Option(None, "--container-mount-home/--no-container-mount-home",
                                          help="as pyxis: mount your home directory (default: no)"),
    c_writable: Optional[bool] = typer.Option(None, "--container-writable/--container-readonly",
                                              help="as pyxis: the image's root file system writable (the default; "
                                                   "writes go to a layer of the job's own) or read-only"),
    c_entrypoint: Optional[bool] = typer.Option(None, "--container-entrypoint/--no-container-entrypoint",
                                                help="as pyxis: run the image's ENTRYPOINT before the command "
                                                     "(default: no)"),
    c_remap_root: Optional[bool] = typer.Option(None, "--container-remap-root/--no-container-remap-root",
                                                help="as pyxis: be root inside the container (still you outside; "
                                                     "default: no)"),
) -> tuple[dict[str, Any], dict[str, str]]:
    """The request `POST /api/v1/jobs` gets for `yard submit`'s options and words (`args`: the command
    or script; `after_dashdash`: they came after `--`), and where each field came from when a script's
    #SBATCH line gave it (named in a refusal); every bad option is exit 2 naming it (`fail`) before
    anything is sent. Its parameters are the options of `yard submit` and, but for the batch-only
    ones, of `yard alloc`, `yard srun --pty` and `yard notebook` (cli/shared_options.py): called
    with all of them. `interactive` (`{"kind": …}`): an allocation, whose job needs no command (the
    plane holds it); its `args` are not the job's."""
    body: dict[str, Any] = {"interactive": interactive} if interactive is not None else {}
    sbatch_lines: dict[str, str] = {}  # the #SBATCH line of each field a script gave (named in a refusal)
    try:
        model_g, gpus_n = (None, None) if gpus is None else gpu_spec(gpus, "--gpus")
        model_n, per_node = (None, None) if gpus_per_node is None else gpu_spec(gpus_per_node, "--gpus-per-node")
        if gres is not None:
            parsed = parse_sbatch(f"#SBATCH --gres={shlex.quote(gres)}\n", "--gres").fields
            if "gpus_per_node" in parsed:
                if per_node is not None:
                    fail("give --gres or --gpus-per-node, not both")
                model_n, per_node = parsed.get("gpu_model"), parsed["gpus_per_node"]  # type: ignore[assignment]
        model_t, per_task = (None, None) if gpus_per_task is None else gpu_spec(gpus_per_task, "--gpus-per-task")
        model_n = model_n or model_t
        if mem_per_cpu is not None:
            parse_mem_mib(mem_per_cpu)
        recorded_env = dict(recorded.record(o, v) for o, v in (
            ("--hint", hint), ("--distribution", distribution), ("--gres-flags", gres_flags), ("--tmp", tmp),
            ("--get-user-env", "" if get_user_env else None), ("--threads-per-core", threads_per_core),
            ("--wckey", wckey)) if v is not None)
        if constraint is not None:
            parse_features(constraint.strip())
        for opt, v in (("--nodelist", nodelist), ("--exclude", exclude)):
            if v is not None:
                try:
                    if not expand_hostlist(v.strip()):
                        raise ValueError(f"no node names in {v!r}")
                except ValueError as e:
                    raise ValueError(f"{opt}: {e}") from None
        for pattern, option in ((output, "--output"), (error, "--error")):
            if pattern is not None:
                io_patterns.check(pattern, option)
        open_mode_ = None if open_mode_ is None else open_mode(open_mode_)
        if mail_type is not None:
            mail_type = parse_mail_type(mail_type) or "NONE"
        if mail_user is not None:
            mail_user = check_mail_user(mail_user)
        asked_datasets = dataset_opts.parse_all(dataset)
        container = container_opts.given(c_image, c_mounts, c_workdir, c_env, {
            "mount_home": c_home, "writable": c_writable, "entrypoint": c_entrypoint, "remap_root": c_remap_root})
    except SbatchError as e:  # --gres, read as its #SBATCH line would be
        fail("--gres: " + str(e).removeprefix("--gres:1: ").removeprefix("gres: ").removeprefix("--gres: "))
    except ConstraintError as e:
        fail(f"-C/--constraint: {e}")
    except ValueError as e:
        fail(str(e))
    if model_g and model_n and model_g.lower() != model_n.lower():
        fail(f"--gpus and --gpus-per-node name different GPU models ({model_g}, {model_n})")
    if recipe is not None:
        if args:
            fail("--recipe: give a recipe or a command/script, not both")
        # Every rank runs `python -m trainyard.recipes RECIPE --set …`; the recipe is validated here
        # (errors name the field) and says how many GPUs to ask for when none are given.
        from trainyard.recipes.spec import RecipeError, absolute_paths, load_recipe, recipe_path, shipped

        try:
            ref = recipe if recipe in shipped() else str(recipe_path(recipe))
            spec = load_recipe(ref, sets)
            sets = [*sets, *absolute_paths(spec)]  # ranks start in the job's workdir, maybe on another node
            if nodes is None and per_node is None and tasks_per_node is None:  # one rank per GPU
                spec.check_world_size(gpus_n if gpus_n is not None else spec.gpus)
        except RecipeError as e:
            fail(str(e))
        _check_recipe_dataset(spec.data.path, asked_datasets)
        # in an image (the job's, or its team's default) the plane runs it with the image's python3
        # (services/images.py `recipe_in_image`)
        body["command"] = [sys.executable, "-m", "trainyard.recipes", ref] + [x for s in sets for x in ("--set", s)]
        body["name"] = spec.name
        if gpus_n is None and per_node is None and nodes is None:
            body["gpus"] = spec.gpus
    elif sets:
        fail("--set: only with --recipe")
    elif wrap is not None:
        if args:
            fail("--wrap: give a command to wrap or a command/script, not both (as sbatch)")
        body["script"] = f"#!/bin/sh\n# This script was created by yard submit --wrap.\n\n{wrap}\n"
        body["name"] = "wrap"  # sbatch's name for it
    elif interactive is not None:
        pass  # the plane's hold script (services/allocations.py); a session runs in it
    elif not args:
        fail("give a command after `--` or a batch script")
    elif len(args) > 1 and not after_dashdash and _looks_like_script(args[:1]):
        # sbatch would pass them to the script; trainyard's batch scripts take none yet, and running
        # the script as a plain command instead would quietly drop its #SBATCH lines
        fail(f"{args[0]}: arguments after a batch script ({' '.join(args[1:])}) are not passed to it; put "
             "yard submit's options before the script, or run it as a command after `--`")
    elif _looks_like_script(args):
        path = Path(args[0])
        try:
            text = path.read_text()
        except OSError as e:
            fail(f"script {args[0]}: {e.strerror or e}")
        try:
            opts = parse_sbatch(text, str(path))
        except SbatchError as e:
            fail(str(e))
        for w in opts.warnings:
            typer.echo(f"warning: {w}", err=True)
        body.update(opts.fields)
        body["env"] = opts.env
        if opts.container:
            body["container"] = opts.container
        sbatch_lines = {k: f"{path}:{no}" for k, no in opts.lines.items()}
        sbatch_lines.update({f"--{k}": sbatch_lines[k] for k in ("nodelist", "exclude") if k in sbatch_lines})
        body["script"] = text
        body.setdefault("name", path.name)
    else:
        body["command"] = args
    unlimited = time_limit is not None and slurm_time(time_limit) is None
    if time_limit is not None:
        time_limit = slurm_time(time_limit)
    given = {"nodes": nodes, "gpus_per_node": per_node, "gpus": gpus_n, "gpu_mem_gb": gpu_mem, "time": time_limit,
             "team": team, "class": job_class, "name": name, "output": output, "tasks_per_node": tasks_per_node,
             "checkpoint_interval": checkpoint_interval, "pool": pool, "workdir": workdir, "dependency": dependency,
             "begin": begin, "array": array, "signal": notice, "mem": mem, "mem_per_gpu": mem_per_gpu, "cpus_per_task": cpus_per_task,
             "error": error, "open_mode": open_mode_, "mail_type": mail_type, "mail_user": mail_user,
             "constraint": constraint, "gpu_model": model_g or model_n, "nodelist": nodelist, "exclude": exclude,
             "ntasks": ntasks, "reservation": reservation, "mem_per_cpu": mem_per_cpu, "gpus_per_task": per_task}
    body.update({k: v for k, v in given.items() if v is not None})
    if unlimited:  # over a script's #SBATCH --time, as sbatch's command line wins
        body["time"] = None
    for k in given:  # a field the command line gave is no longer the script's line
        if given[k] is not None:
            sbatch_lines.pop(k, None)
    if asked_datasets:  # the command line's over the script's #SBATCH --dataset lines, as sbatch's rule
        body["datasets"] = asked_datasets
        for k in [k for k in sbatch_lines if k == "datasets" or k.startswith("datasets.")]:
            sbatch_lines.pop(k)
    for k in container:
        sbatch_lines.pop(f"container.{k}", None)
    body["container"] = container_opts.merged(body.get("container") or {}, container)
    if body["container"] is None:
        body.pop("container")
    first = min((v for k, v in sbatch_lines.items() if k.startswith("container.")), default=None,
                key=lambda w: int(w.rpartition(":")[2]))
    if first is not None:  # a refusal of the whole container (422 on `container`): the script's first such line
        sbatch_lines["container"] = sbatch_lines.get("container.image", first)
    if isinstance(body.get("signal"), str):
        try:
            body["signal"] = parse_signal(body["signal"]).text()
        except ValueError as e:
            fail(str(e))
    if isinstance(body.get("begin"), str):  # read here, in the user's time zone; the API gets seconds
        try:
            body["begin"] = parse_begin(body["begin"], time.time())
        except ValueError as e:
            fail(f"--begin: {e}")
    if hold:
        body["hold"] = True
    if exclusive:
        body["exclusive"] = True
    if "nodes" in body and isinstance(body["nodes"], str) and body["nodes"].isdigit():
        body["nodes"] = int(body["nodes"])
    wd = body.get("workdir") or os.getcwd()
    body["workdir"] = str(Path(wd).resolve())
    try:  # the command line's --export over the script's, as sbatch
        raw_export = body.get("export", "ALL")
        exported = parse_export(export) if export is not None else parse_export(str(body.pop("export", "ALL")))
    except ExportError as e:
        fail(str(e))
    body.pop("export", None)
    envs = {**job_env(exported, os.environ), **body.pop("env", {}), **recorded_env}
    if not exported.everything:  # as sbatch: the job (and its srun) sees what --export said
        envs["SLURM_EXPORT_ENV"] = export if export is not None else str(raw_export)
    for pair in env:
        k, eq, v = pair.partition("=")
        if not eq or not k:
            fail(f"--env: expected KEY=VALUE, got {pair!r}")
        envs[k] = v
    if envs:
        body["env"] = envs
    if body.get("mail_type") == "NONE":  # the command line's NONE over a script's --mail-type
        body["mail_type"] = None
    return body, sbatch_lines


@with_options(job_request, drop=("args", "after_dashdash", "interactive"))
def submit(ctx: typer.Context,
           parsable: bool = typer.Option(False, "--parsable", help="print only the job id (for scripts, as sbatch)"),
           as_json: bool = JSON, **options: Any) -> None:
    """Submit a job: `yard submit OPTIONS -- COMMAND…`, `yard submit OPTIONS SCRIPT` (#SBATCH lines honoured),
    or `yard submit OPTIONS --recipe RECIPE [--set KEY=VALUE …]`.

    Prints the job id."""
    body, sbatch_lines = job_request(list(ctx.args), bool(ctx.meta.get(AFTER_DASHDASH)), None, **options)
    job = Client().post("/api/v1/jobs", json=body, where=sbatch_lines)
    for w in job.pop("warnings", None) or ():
        typer.echo(f"warning: {w}", err=True)
    if as_json:
        print_json(job)
    elif parsable:
        typer.echo(str(job["id"]))
    else:
        typer.echo(f"Submitted job {job['id']}")


def queue(
    team: Optional[str] = typer.Option(None, "-A", "--team", help="only this team's jobs"),
    user: Optional[str] = typer.Option(None, "-u", "--user", help="only these users' jobs (comma-separated), "
                                       "as squeue"),
    me: bool = typer.Option(False, "--me", help="only your own jobs (your token's user), as squeue --me"),
    job_ids: Optional[str] = typer.Option(None, "-j", "--jobs", help="only these jobs (comma-separated ids; an "
                                          "array's id: its tasks), in any state, as squeue -j"),
    state: Optional[str] = typer.Option(None, "-t", "--states",
                                        help="comma-separated states or squeue codes (PD,R,CD...); 'all': every state"),
    all_jobs: bool = typer.Option(False, "-a", "--all", help="finished jobs too"),
    fmt: Optional[str] = typer.Option(None, "-o", "--format",
                                      help="columns as squeue -o: \"%.8i %.9P %.20j %.8u %.2t %.10M %.6D %R\" "
                                           "(%[.][size]letter), or names as -O"),
    names: Optional[str] = typer.Option(None, "-O", "--Format",
                                        help="columns by name as squeue -O: id,name,team,user,class,state,st,time,"
                                             "timelimit,timeleft,nodes,gpus,est_start,start,submit,end,reason,"
                                             "nodelist,reasonlist,image (each [:[.]size])"),
    noheader: bool = typer.Option(False, "-h", "--noheader", help="no header line"),
    as_json: bool = JSON,
) -> None:
    """The queue, like squeue: id, name, team, user, class, state, time, GPUs, est. start, nodes (reason).

    Fits the terminal ($COLUMNS) by cutting names and reasons; ids, users and states stay whole."""
    try:
        shape = queue_format.layout(fmt, names)
    except queue_format.FormatError as e:
        fail(str(e))
    c = Client()
    users = [u.strip() for u in (user or "").split(",") if u.strip()]
    if me:
        users = [*users, c.get("/api/v1/whoami")["user"]]
    try:
        wanted = {int(x) for x in (job_ids or "").split(",") if x.strip()}
    except ValueError:
        fail(f"-j/--jobs: expected job ids separated by commas, got {job_ids!r}")
    params: dict[str, Any] = {k: v for k, v in {"team": team, "state": state}.items() if v}
    if len(set(users)) == 1:
        params["user"] = users[0]
    if not all_jobs and not state and not wanted:
        params["active"] = "true"
    if not as_json:
        params["fields"] = queue_format.api_fields(shape)
    jobs = c.get("/api/v1/jobs", params=params)["jobs"]
    if users:
        jobs = [j for j in jobs if j.get("user") in users]
    if wanted:
        jobs = [j for j in jobs if j["id"] in wanted or j.get("array_job_id") in wanted]
    if as_json:
        print_json(jobs)
        return
    lines = shape.lines(jobs, terminal_width(), header=not noheader)
    if lines:
        typer.echo("\n".join(lines))


def _task_id(c: Client, array_id: int, index: int) -> int | None:
    for t in c.get("/api/v1/jobs", params={"array": array_id, "fields": "id,array_task_id"})["jobs"]:
        if t["array_task_id"] == index:
            return t["id"]
    return None


def resolve(c: Client, text: str) -> int:
    """A job named on the command line: its id, or `ARRAY_TASK` (`42_3`: task 3 of array 42)."""
    a, sep, t = text.partition("_")
    if not (a.isascii() and a.isdigit() and (not sep or (t.isascii() and t.isdigit()))) or len(text) > 40:
        fail(f"{text!r} is not a job id (42) nor an array task (42_3)")
    if not sep:
        return int(a)
    jid = _task_id(c, int(a), int(t))
    if jid is None:
        fail(f"no task {t} in job array {a}")
    return jid


def show(job_id: str = typer.Argument(..., help="job id, or ARRAY_TASK (42_3)"), as_json: bool = JSON) -> None:
    """Everything about one job, with its attempts (scontrol show job)."""
    c = Client()
    j = c.get(f"/api/v1/jobs/{resolve(c, job_id)}")
    if as_json:
        print_json(j)
        return
    keys = ["id", "name", "user", "team", "class", "pool", "state", "reason", "held", "nodes_min", "nodes_max",
            "gpus_per_node", "gpus", "tasks_per_node", "gpu_mem_gb", "time_limit_s", "checkpoint_interval_s",
            "attempt", "dependency", "array_job_id", "array_task_id", "exit_code", "signal", "workdir", "output",
            "job_dir", "constraint", "gpu_model", "nodelist_asked", "exclude_nodes", "exclusive", "ntasks"]
    for k in keys:
        typer.echo(f"{k:>22}: {clean(j.get(k))}")
    typer.echo(f"{'memory':>22}: {memory_line(j)}")
    typer.echo(f"{'cpus':>22}: {cpus_line(j)}")
    if recorded.shown(j.get("env")):
        typer.echo(f"{'recorded options':>22}: {clean(recorded.shown(j.get('env')))} (not acted on: "
                   "cli/recorded.py)")
    typer.echo(f"{'command':>22}: {clean(' '.join(j['command'] or [])) or '(batch script)'}")
    if j.get("interactive"):  # an allocation (issue 38): its kind, and its session's exit once it ended it
        ia = j["interactive"]
        typer.echo(f"{'interactive':>22}: {clean(ia.get('kind'))}"
                   + (f", session exited {clean(ia['exit'])}" if ia.get("exit") is not None else ""))
    if image_view.image_line(j.get("container"), j.get("image_digest")):
        typer.echo(f"{'image':>22}: {clean(image_view.image_line(j['container'], j.get('image_digest')))}")
        if image_view.options_line(j["container"]):
            typer.echo(f"{'container':>22}: {clean(image_view.options_line(j['container']))}")
    for d in j.get("datasets") or ():  # pinned at submit (services/datasets.py): what every node stages
        from trainyard.cli.storage import size as _size

        typer.echo(f"{'dataset':>22}: {clean(d['name'])}:{clean(d['version'])} {clean(d['checksum'])} "
                   f"{_size(d['bytes']) if d.get('bytes') else 'size unknown'} from {clean(d['source'])}")
    for k in ("submit_time", "begin_time", "eligible_time", "start_time", "end_time", "est_start"):
        typer.echo(f"{k:>22}: {'' if j[k] is None else time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(j[k]))}")
    typer.echo(f"{'limits':>22}: {limits_line(j)}")
    typer.echo(f"{'nodelist':>22}: {nodelist(j['placement'])}")
    typer.echo(f"{'gpus (node:indices)':>22}: {clean(gpu_indices(j['placement']))}")
    typer.echo(f"{'retries':>22}: {j.get('retries', 0)}")
    typer.echo(f"{'lost GPU-seconds':>22}: {j.get('lost_gpu_s', 0):.1f} (work since the last checkpoint, all attempts)")
    if j.get("disk"):  # its job dir, as the storage meter last measured it (yard storage)
        from trainyard.cli.storage import size

        d = j["disk"]
        typer.echo(f"{'disk':>22}: {size(d['bytes'])}{'' if d['complete'] else ' or more'} (its job dir, measured "
                   f"{time.strftime('%H:%M:%S', time.localtime(d['measured_at']))})")
    if j.get("avoid_nodes"):
        typer.echo(f"{'avoids':>22}: {clean(','.join(j['avoid_nodes']))} (earlier attempts failed there; used only if "
                   "nothing else fits)")
    for e in straggler_events(c, j["id"]):  # issue 39: a slow rank, named with its node (control/loop/stragglers.py)
        typer.echo(f"{'straggler':>22}: {time.strftime('%H:%M:%S', time.localtime(e['time']))} {clean(e['message'])}")
    if j.get("attempts"):
        digests = any(a.get("image_digest") for a in j["attempts"])  # a column only for a job with an image
        table(["ATTEMPT", "STATE", "CAUSE", "STARTED", "RAN", "EXIT", "SIGNAL", "LOST GPU-s", "RECOVERY", "NODES",
               "GPUS", *(["IMAGE DIGEST"] if digests else []), "REASON"],
              [[a["attempt"], a["state"], a.get("cause", ""), clock(a["started_at"]),
                duration((a["ended_at"] or time.time()) - a["started_at"]), "" if a["exit_code"] is None else a["exit_code"],
                "" if a["signal"] is None else a["signal"], f"{a.get('lost_gpu_s') or 0:.1f}",
                "" if a.get("recover_s") is None else f"{a['recover_s']:.1f}s",
                nodelist(a["placement"]), gpu_indices(a["placement"]),
                *([image_view.short_digest(a.get("image_digest"))] if digests else []), a["reason"]]
               for a in j["attempts"]],
              plain=True)  # every state and cause whole: the reason, last, may be as long as it is


def straggler_events(c: Client, job_id: int) -> list[dict]:
    """The job's straggler flags and recoveries, oldest first."""
    evs = c.get(f"/api/v1/jobs/{job_id}/events")["events"]
    return [e for e in evs if e.get("kind") in ("job.straggler", "job.straggler_recovered")]


def memory_line(j: dict) -> str:
    """The job's memory as asked: --mem per node, --mem-per-gpu, or --mem-per-cpu (with the node's
    limit it gives); 'no limit' when none was."""
    per_cpu = (j.get("env") or {}).get("SLURM_MEM_PER_CPU")
    if per_cpu:
        return f"{per_cpu}M per CPU (--mem-per-cpu), {j.get('mem_mib')}M per node"
    if j.get("mem_mib") is not None:
        return f"{j['mem_mib']}M per node (--mem)"
    if j.get("mem_per_gpu_mib") is not None:
        return f"{j['mem_per_gpu_mib']}M per GPU (--mem-per-gpu)"
    return "no limit (none asked)"


def cpus_line(j: dict) -> str:
    """-c/--cpus-per-task as asked, or that none was (the ranks share their nodes' CPUs)."""
    c = j.get("cpus_per_task")
    return f"{c} per task (-c)" if c is not None else "not limited (no -c)"


def limits_line(j: dict) -> str:
    """What the job may use on each node, as Slurm-like key=value words (scontrol's names where it
    has them): --mem, --mem-per-gpu, --cpus-per-task, and the pids limit its latest attempt was
    launched with (the configuration's; not known before the first launch)."""
    words = [f"{k}={v}" for k, v in (("MinMemoryNode", j.get("mem_mib")), ("MinMemoryGPU", j.get("mem_per_gpu_mib")),
                                     ("CPUsPerTask", j.get("cpus_per_task"))) if v is not None]
    words = [w + "M" if w.startswith("MinMemory") else w for w in words]
    pids = j.get("pids_max")
    return " ".join(words + [f"PidsLimit={pids}" if pids is not None else "PidsLimit=(set at launch)"])


def _expand(c: Client, texts: list[str], verb: str) -> list[int]:
    """The jobs a cancel, hold, release or requeue acts on. As scancel reads it, an array's id means
    every task of the array (those not yet ended, but for a requeue), `42_3` one task."""
    out: list[int] = []
    for text in texts:
        jid = resolve(c, text)
        if "_" not in text:
            tasks = c.get("/api/v1/jobs", params={"array": jid, "fields": "id,state"})["jobs"]
            live = [t["id"] for t in tasks if verb == "requeue" or t["state"] not in TERMINAL_STATES]
            if live:  # (an array whose tasks have all ended: the array's own job reports it)
                out += live
                continue
        out.append(jid)
    return list(dict.fromkeys(out))


def _act(verb: str):  # noqa: ANN202
    def command(job_ids: list[str] = typer.Argument(..., help="job ids; an array's id means all its tasks, "
                                                              "ARRAY_TASK (42_3) one of them"),
                as_json: bool = JSON) -> None:
        # As scancel does: a job that cannot be acted on (already ended, not yours) is reported and
        # the others are still acted on; the exit code is 2 if any was refused. An unreachable
        # server stops at once (exit 1).
        c, out, refused = Client(), [], 0
        for jid in _expand(c, job_ids, verb):
            try:
                j = c.post(f"/api/v1/jobs/{jid}/{verb}")
            except typer.Exit as e:
                if e.exit_code != EXIT_BAD_INPUT:
                    raise
                refused = e.exit_code  # _die has printed why
                continue
            out.append(j)
            if not as_json:
                typer.echo(f"job {queue_format.shown_id(j)}: {j['state']}"
                           + (f" ({clean(j['reason'])})" if j["reason"] not in ("", "None") else ""))
        if as_json:
            print_json(out)
        if refused:
            raise typer.Exit(refused)
    command.__doc__ = {"cancel": "Cancel jobs (scancel): pending ones at once, running ones get SIGTERM, then SIGKILL.",
                       "hold": "Hold pending jobs: they keep their place but do not start.",
                       "release": "Release held jobs.",
                       "requeue": "Requeue jobs: a running one is asked to checkpoint and goes back to the queue; "
                                  "a finished one is queued again."}[verb]
    return command


cancel, hold, release, requeue = (_act(v) for v in ("cancel", "hold", "release", "requeue"))


def logs(job_id: str = typer.Argument(..., help="job id, or ARRAY_TASK (42_3)"),
         follow: bool = typer.Option(False, "-f", "--follow", help="keep printing until the job ends"),
         rank: int = typer.Option(0, "--rank", "-r", help="which rank's log"),
         tail: Optional[int] = typer.Option(None, "--tail", min=1, help="only the last N bytes (with -f: then "
                                            "what comes)")) -> None:
    """A job's log (stdout and stderr of one rank), read page by page (the API serves at most
    8 MiB at a time), so a log of any size prints in bounded memory."""
    c = Client()
    job_id = str(resolve(c, job_id))
    offset: int | None = -tail if tail else 0
    if follow:
        for chunk in c.stream(f"/api/v1/jobs/{job_id}/logs", {"rank": rank, "follow": "true", "offset": offset}):
            sys.stdout.write(chunk)
            sys.stdout.flush()
        return
    out = sys.stdout.buffer
    while offset is not None:
        page = c.page(f"/api/v1/jobs/{job_id}/logs", params={"rank": rank, "offset": offset})
        out.write(page.content)
        out.flush()
        nxt, size = int(page.headers.get("x-log-next-offset", 0)), int(page.headers.get("x-log-size", 0))
        offset = nxt if page.content and nxt < size else None


def events(job_id: Optional[str] = typer.Argument(None, help="only this job's events (an id, or ARRAY_TASK: 42_3)"),
           limit: int = typer.Option(200, "-n", "--limit", help="how many (newest)"),
           fmt: str = typer.Option(event_format.DEFAULT, "-o", "--format",
                                   help="columns by name: time,actor,event,job,node,why (each [:size])"),
           noheader: bool = typer.Option(False, "-h", "--noheader", help="no header line"),
           as_json: bool = JSON) -> None:
    """The audit trail: who changed what, when and why. Fits the terminal ($COLUMNS) by cutting WHY."""
    try:
        fields = event_format.parse(fmt)
    except ValueError as e:
        fail(str(e))
    c = Client()
    if job_id is not None:
        evs = c.get(f"/api/v1/jobs/{resolve(c, job_id)}/events")["events"]
    else:
        evs = c.get("/api/v1/events", params={"limit": limit, "newest": "true"})["events"]
    evs = evs[-limit:]
    if as_json:
        print_json(evs)
        return
    out = event_format.lines(evs, fields, terminal_width(), header=not noheader)
    if out:
        typer.echo("\n".join(out))
