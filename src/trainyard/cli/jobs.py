"""Job commands, for people used to Slurm: submit (sbatch), queue (squeue), show (scontrol show
job), cancel (scancel), hold / release / requeue (scontrol), logs, events."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer

from trainyard.cli.client import Client
from trainyard.cli.common import EXIT_BAD_INPUT, fail
from trainyard.cli.render import ago, clock, duration, nodelist, print_json, table
from trainyard.cli.sbatch import SbatchError, parse_sbatch, slurm_time
from trainyard.parsing import parse_begin
from trainyard.states import TERMINAL_STATES

JSON = typer.Option(False, "--json", help="print JSON instead of a table")
SCRIPT_SUFFIXES = (".sh", ".sbatch", ".slurm", ".bash")


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


def submit(
    ctx: typer.Context,
    nodes: Optional[str] = typer.Option(None, "-N", "--nodes", help="nodes: a number or a range MIN-MAX (elastic)"),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", help="GPUs on each node"),
    gpus: Optional[int] = typer.Option(None, "-G", "--gpus", help="total GPUs (anywhere, or divided over --nodes)"),
    gpu_mem: Optional[float] = typer.Option(None, "--gpu-mem", help="GB of GPU memory needed on each GPU (shares GPUs)"),
    time_limit: Optional[str] = typer.Option(None, "-t", "--time", help="time limit: minutes, MM:SS, HH:MM:SS, D-HH:MM:SS, or 30m / 2h"),
    team: Optional[str] = typer.Option(None, "-A", "--team", "--account", help="team (default: your token's)"),
    job_class: Optional[str] = typer.Option(None, "-q", "--class", "--qos", help="class: interactive, training, batch"),
    name: Optional[str] = typer.Option(None, "-J", "--name", "--job-name", help="job name"),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="also link the log here (%j id, %t rank, %x name)"),
    tasks_per_node: Optional[int] = typer.Option(None, "--ntasks-per-node", help="ranks per node (default: one per GPU)"),
    checkpoint_interval: Optional[str] = typer.Option(None, "--checkpoint-interval", help="how often the job checkpoints"),
    pool: Optional[str] = typer.Option(None, "-p", "--pool", "--partition", help="pool of nodes"),
    workdir: Optional[str] = typer.Option(None, "-D", "--chdir", help="working directory (default: here)"),
    env: list[str] = typer.Option([], "--env", "-e", help="KEY=VALUE for the job's environment (repeatable)"),
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
    parsable: bool = typer.Option(False, "--parsable", help="print only the job id (for scripts, as sbatch)"),
    recipe: Optional[str] = typer.Option(None, "--recipe", help="a training recipe (llama-pretrain, gemma-pretrain, "
                                         "sft, rl, or a YAML file) instead of a command"),
    sets: list[str] = typer.Option([], "--set", help="with --recipe: override a recipe field, KEY=VALUE (repeatable)"),
    as_json: bool = JSON,
) -> None:
    """Submit a job: `yard submit OPTIONS -- COMMAND…`, `yard submit OPTIONS SCRIPT` (#SBATCH lines honoured),
    or `yard submit OPTIONS --recipe RECIPE [--set KEY=VALUE …]`.

    Prints the job id."""
    args = list(ctx.args)
    body: dict[str, Any] = {}
    if recipe is not None:
        if args:
            fail("--recipe: give a recipe or a command/script, not both")
        # Every rank runs `python -m trainyard.recipes RECIPE --set …`; the recipe is validated here
        # (errors name the field) and says how many GPUs to ask for when none are given.
        from trainyard.recipes.spec import RecipeError, load_recipe, recipe_path, shipped

        try:
            ref = recipe if recipe in shipped() else str(recipe_path(recipe))
            spec = load_recipe(ref, sets)
            sets = list(sets)
            if spec.init_from and not Path(spec.init_from).expanduser().is_absolute():
                sets.append(f"init_from={Path(spec.init_from).expanduser().resolve()}")
            if nodes is None and gpus_per_node is None and tasks_per_node is None:  # one rank per GPU
                spec.check_world_size(gpus if gpus is not None else spec.gpus)
        except RecipeError as e:
            fail(str(e))
        body["command"] = [sys.executable, "-m", "trainyard.recipes", ref] + [x for s in sets for x in ("--set", s)]
        body["name"] = spec.name
        if gpus is None and gpus_per_node is None and nodes is None:
            body["gpus"] = spec.gpus
    elif sets:
        fail("--set: only with --recipe")
    elif not args:
        fail("give a command after `--` or a batch script")
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
        body["script"] = text
        body.setdefault("name", path.name)
    else:
        body["command"] = args
    if time_limit is not None:
        time_limit = slurm_time(time_limit)
    given = {"nodes": nodes, "gpus_per_node": gpus_per_node, "gpus": gpus, "gpu_mem_gb": gpu_mem, "time": time_limit,
             "team": team, "class": job_class, "name": name, "output": output, "tasks_per_node": tasks_per_node,
             "checkpoint_interval": checkpoint_interval, "pool": pool, "workdir": workdir, "dependency": dependency,
             "begin": begin, "array": array}
    body.update({k: v for k, v in given.items() if v is not None})
    if isinstance(body.get("begin"), str):  # read here, in the user's time zone; the API gets seconds
        try:
            body["begin"] = parse_begin(body["begin"], time.time())
        except ValueError as e:
            fail(f"--begin: {e}")
    if hold:
        body["hold"] = True
    if "nodes" in body and isinstance(body["nodes"], str) and body["nodes"].isdigit():
        body["nodes"] = int(body["nodes"])
    wd = body.get("workdir") or os.getcwd()
    body["workdir"] = str(Path(wd).resolve())
    envs: dict[str, str] = {}
    for e in env:
        k, eq, v = e.partition("=")
        if not eq or not k:
            fail(f"--env: expected KEY=VALUE, got {e!r}")
        envs[k] = v
    if envs:
        body["env"] = envs
    job = Client().post("/api/v1/jobs", json=body)
    if as_json:
        print_json(job)
    elif parsable:
        typer.echo(str(job["id"]))
    else:
        typer.echo(f"Submitted job {job['id']}")


QUEUE_FIELDS = ("id,name,team,user,class,state,start_time,submit_time,nodes_min,nodes_max,gpus,gpus_per_node,"
                "placement,reason,est_start,array_job_id,array_task_id")


def _shown_id(j: dict) -> str:
    """As squeue shows it: an array's task as ARRAY_TASK, any other job by its id."""
    return str(j["id"]) if j.get("array_job_id") is None else f"{j['array_job_id']}_{j['array_task_id']}"


def _queue_rows(jobs: list[dict], now: float) -> list[list[Any]]:
    rows = []
    for j in jobs:
        running = j["state"] in ("RUNNING", "COMPLETING")
        t = ago(j["start_time"], now) if running else ago(j["submit_time"], now) if j["state"] in ("PENDING", "REQUEUED") else ""
        size = (f"{j['nodes_min']}" if j["nodes_min"] == j["nodes_max"] else f"{j['nodes_min']}-{j['nodes_max']}")
        gpus = j["gpus"] if j["gpus_per_node"] is None else f"{size}x{j['gpus_per_node']}"
        where = nodelist(j["placement"]) if running else f"({j['reason']})"
        rows.append([_shown_id(j), j["name"][:20], j["team"], j["user"], j["class"], j["state"], t, gpus,
                     clock(j["est_start"]) if not running else "", where])
    return rows


def queue(
    team: Optional[str] = typer.Option(None, "-A", "--team", help="only this team's jobs"),
    user: Optional[str] = typer.Option(None, "-u", "--user", help="only this user's jobs"),
    state: Optional[str] = typer.Option(None, "-t", "--states",
                                        help="comma-separated states or squeue codes (PD,R,CD...); 'all': every state"),
    all_jobs: bool = typer.Option(False, "-a", "--all", help="finished jobs too"),
    as_json: bool = JSON,
) -> None:
    """The queue, like squeue: id, name, team, user, class, state, time, GPUs, est. start, nodes (reason)."""
    params: dict[str, Any] = {k: v for k, v in {"team": team, "user": user, "state": state}.items() if v}
    if not all_jobs and not state:
        params["active"] = "true"
    if not as_json:
        params["fields"] = QUEUE_FIELDS
    jobs = Client().get("/api/v1/jobs", params=params)["jobs"]
    if as_json:
        print_json(jobs)
        return
    table(["JOBID", "NAME", "TEAM", "USER", "CLASS", "STATE", "TIME", "GPUS", "EST.START", "NODELIST(REASON)"],
          _queue_rows(jobs, time.time()))


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
            "attempt", "dependency", "array_job_id", "array_task_id", "exit_code", "signal", "workdir", "output"]
    for k in keys:
        typer.echo(f"{k:>22}: {'' if j.get(k) is None else j.get(k)}")
    typer.echo(f"{'command':>22}: {' '.join(j['command'] or []) or '(batch script)'}")
    for k in ("submit_time", "begin_time", "eligible_time", "start_time", "end_time", "est_start"):
        typer.echo(f"{k:>22}: {'' if j[k] is None else time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(j[k]))}")
    typer.echo(f"{'placement':>22}: {nodelist(j['placement'])}")
    typer.echo(f"{'retries':>22}: {j.get('retries', 0)}")
    typer.echo(f"{'lost GPU-seconds':>22}: {j.get('lost_gpu_s', 0):.1f} (work since the last checkpoint, all attempts)")
    if j.get("avoid_nodes"):
        typer.echo(f"{'avoids':>22}: {','.join(j['avoid_nodes'])} (earlier attempts failed there; used only if "
                   "nothing else fits)")
    if j.get("attempts"):
        table(["ATTEMPT", "STATE", "CAUSE", "STARTED", "RAN", "EXIT", "SIGNAL", "LOST GPU-s", "RECOVERY", "NODES",
               "REASON"],
              [[a["attempt"], a["state"], a.get("cause", ""), clock(a["started_at"]),
                duration((a["ended_at"] or time.time()) - a["started_at"]), "" if a["exit_code"] is None else a["exit_code"],
                "" if a["signal"] is None else a["signal"], f"{a.get('lost_gpu_s') or 0:.1f}",
                "" if a.get("recover_s") is None else f"{a['recover_s']:.1f}s",
                nodelist(a["placement"]), a["reason"]] for a in j["attempts"]])


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
                typer.echo(f"job {_shown_id(j)}: {j['state']}"
                           + (f" ({j['reason']})" if j["reason"] not in ("", "None") else ""))
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
         rank: int = typer.Option(0, "--rank", "-r", help="which rank's log")) -> None:
    """A job's log (stdout and stderr of one rank)."""
    c = Client()
    job_id = str(resolve(c, job_id))
    if not follow:
        sys.stdout.write(c.get(f"/api/v1/jobs/{job_id}/logs", params={"rank": rank}))
        return
    for chunk in c.stream(f"/api/v1/jobs/{job_id}/logs", {"rank": rank, "follow": "true"}):
        sys.stdout.write(chunk)
        sys.stdout.flush()


def events(job_id: Optional[str] = typer.Argument(None, help="only this job's events (an id, or ARRAY_TASK: 42_3)"),
           limit: int = typer.Option(200, "-n", "--limit", help="how many (newest)"), as_json: bool = JSON) -> None:
    """The audit trail: who changed what, when and why."""
    c = Client()
    if job_id is not None:
        evs = c.get(f"/api/v1/jobs/{resolve(c, job_id)}/events")["events"]
    else:
        evs = c.get("/api/v1/events", params={"limit": limit, "newest": "true"})["events"]
    evs = evs[-limit:]
    if as_json:
        print_json(evs)
        return
    table(["TIME", "ACTOR", "EVENT", "JOB", "NODE", "WHY"],
          [[time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(e["time"])), e["actor"], e["kind"],
            e["job_id"] or "", e["node"] or "", e["message"]] for e in evs])
