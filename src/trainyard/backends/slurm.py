"""The Slurm backend: the control loop's decisions carried out by an existing Slurm cluster.

trainyard keeps deciding (quotas, classes, preemption by checkpoint, retries); Slurm starts the
processes across nodes. Each attempt is one batch job pinned to the engine's placement:

    sbatch --nodelist=<the placement's nodes> --nodes=N --ntasks-per-node=K --gres=gpu:G
           --no-requeue --job-name=yard-<job>-<attempt> --chdir=<workdir> <run dir>/batch.sh

and the batch script runs one `srun` step that starts every rank through `slurm_task.py` (Slurm's
own SLURM_* variables, plus the rest of `contracts.rank_env` built from them; MASTER_ADDR = the
first node's address; each rank's output in `JobDir.rank_log`) and the same rank runner as the local backend,
whose exit records land in `<job dir>/run/attempt-<a>/` — the job dir is on a file system the
control plane and the nodes share, as a Slurm cluster's home or project space is.

Facts come from those records and from Slurm: `squeue` for the batch jobs, `scontrol show node`
for the inventory (GPUs from GRES, block and rack from node features; GPU memory, which Slurm does
not know, from the cluster configuration the backend is created with). A node Slurm reports DOWN, DRAIN, FAIL or NOT_RESPONDING is unhealthy; a rank
on it with no exit record is `lost`, like a rank of a dead emulated node. Signals go through
`scancel --signal=<SIG>` (every task of every step: the preemption notice is SIGUSR1), and
`release` cancels the batch job. A job Slurm shows STOPPED (its tasks got SIGSTOP) has frozen
ranks: `running` and `stopped`, as on the local backend. When `squeue` does not answer, `poll`
raises `BackendError` (the control loop skips that pass) rather than report ranks lost. `--no-requeue`: Slurm never restarts an attempt on its own —
requeues are the control loop's, with a new attempt number.

Nothing in slurm.conf changes. What trainyard needs there: a partition for its jobs whose nodes
it alone schedules (or at least whose GPUs it alone hands out), GPUs as GRES (`gres/gpu`), and
the job dir on a shared file system. Whole-GPU placements ask Slurm for the same GPU count per
node; a placement that shares GPUs (`gpu_mem` requests) asks for none and narrows
CUDA_VISIBLE_DEVICES itself.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal as _signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainyard.backends import registry
from trainyard.backends._files import read_json, write_json
from trainyard.backends.base import AttemptState, BackendError, LaunchSpec, NodeInfo, RankState
from trainyard.contracts import JobDir

TASK = Path(__file__).with_name("slurm_task.py")
UNHEALTHY_FLAGS = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWER", "REBOOT", "MAINT", "UNKNOWN")
# Job states (squeue(1) "JOB STATE CODES") in which the batch job is not over: its ranks run, wait
# or are held. STOPPED is a job whose tasks were sent SIGSTOP (frozen: running, `stopped`), not one
# that ended; the *_HOLD/REQUEUE* ones do not occur with --no-requeue but are not ends either.
ACTIVE_JOB_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "RESIZING",
                     "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT", "STAGE_OUT",
                     "SIGNALING")


@dataclass
class _Attempt:
    job_id: int
    attempt: int
    run_dir: Path
    world_size: int
    slurm_id: int
    nodes: dict[int, str] = field(default_factory=dict)  # rank → planned node (actual: rank-<r>.node)


def parse_kv_line(line: str) -> dict[str, str]:
    """`scontrol show … -o` output: space-separated Key=Value pairs (values without spaces)."""
    out: dict[str, str] = {}
    for tok in line.split():
        k, sep, v = tok.partition("=")
        if sep:
            out[k] = v
    return out


def gres_gpus(gres: str) -> tuple[int, str]:
    """`gpu:4`, `gpu:a100:8(S:0-1)`, `gpu:a100:4,shard:8` → (GPU count, model)."""
    for item in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if parts[0] == "gpu" and len(parts) >= 2:
            try:
                return int(parts[-1]), parts[1] if len(parts) == 3 else "gpu"
            except ValueError:
                continue
    return 0, "gpu"


def features_topology(features: str) -> dict[str, str]:
    """Node features naming its place (`block=b1`, `block:b1` or `block_b1`; the same for `rack`)
    → {"block": "b1", "rack": "r3"}: what topology-aware gang placement groups nodes by."""
    out: dict[str, str] = {}
    for feat in features.split(","):
        for key in ("block", "rack"):
            for sep in ("=", ":", "_"):
                if feat.startswith(key + sep) and len(feat) > len(key) + 1:
                    out[key] = feat[len(key) + 1:]
    return out


def node_health(state: str) -> tuple[bool, str]:
    """Slurm's node state (`IDLE`, `MIXED+DRAIN`, `DOWN*`, `IDLE+NOT_RESPONDING`) → (healthy, why)."""
    flags = state.upper().replace("*", "+NOT_RESPONDING").split("+")
    bad = [f for f in flags if f in UNHEALTHY_FLAGS]
    return (not bad, "up" if not bad else "-".join(b.lower() for b in bad))


class SlurmBackend:
    """Runs each attempt as a Slurm batch job; see the module docstring.

    Args:
        data_dir: the control plane's data dir (job dirs under it must be visible on the nodes).
        partition: the Slurm partition trainyard's jobs go to (None: the cluster's default).
        gpu_mem_mib: GPU memory per node name (from the cluster configuration), or one value for
            all (Slurm does not know it); a node missing from the mapping gets 81920.
        env: extra environment for the Slurm commands (e.g. SLURM_CONF).
        launch_timeout_s: how long a launch waits for Slurm to start every rank.
        python: the interpreter the nodes run the rank wrapper with.
    """

    name = "slurm"

    def __init__(self, data_dir: str | Path, *, partition: str | None = None,
                 gpu_mem_mib: int | dict[str, int] = 81920, env: dict[str, str] | None = None,
                 launch_timeout_s: float = 60.0, python: str = sys.executable) -> None:
        self._data_dir = Path(data_dir)
        self._partition = partition
        self._gpu_mem = gpu_mem_mib
        self._env = {**os.environ, **(env or {})}
        self._launch_timeout_s = launch_timeout_s
        self._python = python
        self._lock = threading.RLock()
        self._attempts: dict[tuple[int, int], _Attempt] = {}
        self._node_cache: tuple[float, dict[str, dict[str, str]]] | None = None
        require_commands(self._env)
        self._discover()

    # -- Slurm commands --------------------------------------------------------------------------

    def _run(self, *args: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
        try:
            r = subprocess.run(list(args), env=self._env, capture_output=True, text=True, timeout=timeout,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise BackendError(f"slurm: `{' '.join(args[:2])}` did not answer in {timeout:.0f}s") from e
        except OSError as e:
            raise BackendError(f"slurm: cannot run {args[0]}: {e.strerror}") from e
        if check and r.returncode != 0:
            raise BackendError(f"slurm: `{' '.join(args[:3])}` failed ({r.returncode}): {r.stderr.strip()[:500]}")
        return r

    def _nodes(self, max_age_s: float = 0.5) -> dict[str, dict[str, str]]:
        """`scontrol show node -o`, parsed, cached for a moment (poll and inventory both read it)."""
        now = time.monotonic()
        if self._node_cache is not None and now - self._node_cache[0] < max_age_s:
            return self._node_cache[1]
        out = self._run("scontrol", "show", "node", "-o").stdout
        nodes = {}
        for line in out.splitlines():
            kv = parse_kv_line(line)
            if "NodeName" not in kv:
                continue
            if self._partition and self._partition not in kv.get("Partitions", "").split(","):
                continue
            nodes[kv["NodeName"]] = kv
        self._node_cache = (now, nodes)
        return nodes

    def _job_states(self, slurm_ids: list[int]) -> dict[int, str] | None:
        """State of each batch job Slurm still knows (`squeue -t all` keeps ended ones a while), or
        None when Slurm did not answer (slurmctld busy or down: squeue failed or timed out).

        No answer is no fact: a caller must not read "the job is gone" into it (that made every
        rank of every attempt `lost`, and their jobs NODE_FAIL, whenever slurmctld was slow to
        answer under load). Asked about one job it no longer knows, squeue exits 1 with "Invalid
        job id specified": that is an answer (gone).
        """
        if not slurm_ids:
            return {}
        try:
            r = self._run("squeue", "-h", "-t", "all", "-o", "%i %T", "-j", ",".join(map(str, slurm_ids)),
                          check=False)
        except BackendError:
            return None
        if r.returncode != 0 and "Invalid job id" not in r.stderr:
            return None
        states = {}
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit():
                states[int(parts[0])] = parts[1]
        return states

    # -- interface ------------------------------------------------------------------------------

    def inventory(self) -> list[NodeInfo]:
        """Slurm's nodes (of the partition): GPUs from GRES, health from the node state, block and
        rack from the node features (`features_topology`)."""
        out = []
        for name, kv in sorted(self._nodes(max_age_s=0).items()):
            gpus, model = gres_gpus(kv.get("Gres", ""))
            healthy, why = node_health(kv.get("State", "UNKNOWN"))
            mem = self._gpu_mem.get(name, 81920) if isinstance(self._gpu_mem, dict) else self._gpu_mem
            topo = features_topology(kv.get("ActiveFeatures") or kv.get("AvailableFeatures") or "")
            out.append(NodeInfo(name, gpus, model, mem, healthy=healthy, state=why,
                                block=topo.get("block", ""), rack=topo.get("rack", "")))
        return out

    def launch(self, spec: LaunchSpec) -> None:
        """Submit the attempt as one batch job and wait until every rank has started, or none.

        Raises:
            BackendError: unknown or unhealthy node, workdir missing, Slurm refused the job, or
                the ranks did not all start within `launch_timeout_s` (the job is cancelled).
        """
        with self._lock:
            where = f"job {spec.job_id} attempt {spec.attempt}"
            if (spec.job_id, spec.attempt) in self._attempts:
                raise BackendError(f"{where}: already launched (release it first)")
            if not spec.command or not spec.ranks:
                raise BackendError(f"{where}: empty command or no ranks")
            if not Path(spec.workdir).is_dir():
                raise BackendError(f"{where}: workdir {spec.workdir!r} is not a directory")
            nodes = self._nodes(max_age_s=0)
            order: list[str] = []
            for r in sorted(spec.ranks, key=lambda r: r.rank):
                if r.node not in nodes:
                    raise BackendError(f"{where}: rank {r.rank} placed on {r.node!r}, which Slurm does not know")
                if r.node not in order:
                    order.append(r.node)
            for n in order:
                healthy, why = node_health(nodes[n].get("State", "UNKNOWN"))
                if not healthy:
                    raise BackendError(f"{where}: placed on {n}, which Slurm reports {why}")
            per_node = {n: [r for r in spec.ranks if r.node == n] for n in order}
            counts = {len(v) for v in per_node.values()}
            if len(counts) != 1:
                raise BackendError(f"{where}: the Slurm backend runs the same number of ranks on every node; "
                                   f"the placement has {sorted(len(v) for v in per_node.values())}")
            k = counts.pop()
            gpus_per_node = {n: len({g for r in v for g in r.gpus}) for n, v in per_node.items()}
            gpn = max(gpus_per_node.values())
            per_rank = max(len(r.gpus) for r in spec.ranks)

            jd = JobDir(spec.job_dir)
            run_dir = jd.attempt_run(spec.attempt)
            try:
                jd.logs.mkdir(parents=True, exist_ok=True)
                if run_dir.exists():
                    shutil.rmtree(run_dir)
                run_dir.mkdir(parents=True)
            except OSError as e:
                raise BackendError(f"{where}: cannot create {e.filename}: {e.strerror}") from e
            script = run_dir / "batch.sh"
            script.write_text(self._batch_script(spec, run_dir, per_rank))
            args = ["sbatch", "--parsable", f"--job-name=yard-{spec.job_id}-{spec.attempt}",
                    f"--nodes={len(order)}", f"--nodelist={','.join(order)}", f"--ntasks-per-node={k}",
                    "--no-requeue", f"--chdir={spec.workdir}", f"--output={run_dir / 'batch.log'}",
                    "--open-mode=append", "--export=ALL"]
            if self._partition:
                args.append(f"--partition={self._partition}")
            if gpn:
                args.append(f"--gres=gpu:{gpn}")
            env = {k_: v for k_, v in self._env.items() if not k_.startswith("TRAINYARD_")}
            env.update(spec.env)
            env.update(TRAINYARD_JOB_ID=str(spec.job_id), TRAINYARD_ATTEMPT=str(spec.attempt),
                       TRAINYARD_CHECKPOINT_DIR=spec.checkpoint_dir)
            try:
                r = subprocess.run([*args, str(script)], env=env, capture_output=True, text=True, timeout=30,
                                   stdin=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired) as e:
                shutil.rmtree(run_dir, ignore_errors=True)
                raise BackendError(f"{where}: sbatch failed: {e}") from e
            if r.returncode != 0 or not r.stdout.strip().split(";")[0].isdigit():
                shutil.rmtree(run_dir, ignore_errors=True)
                raise BackendError(f"{where}: Slurm refused the job: {r.stderr.strip()[:500]}")
            slurm_id = int(r.stdout.strip().split(";")[0])
            att = _Attempt(spec.job_id, spec.attempt, run_dir, len(spec.ranks), slurm_id,
                           nodes={r_.rank: r_.node for r_ in spec.ranks})
            write_json(run_dir / "attempt.json", {"job_id": spec.job_id, "attempt": spec.attempt,
                                                   "world_size": len(spec.ranks), "slurm_job_id": slurm_id,
                                                   "ranks": [{"rank": x.rank, "node": x.node} for x in spec.ranks]})
            try:
                self._await_ranks(att)
            except BaseException:
                self._cancel(att)
                shutil.rmtree(run_dir, ignore_errors=True)
                raise
            self._attempts[(spec.job_id, spec.attempt)] = att

    def _batch_script(self, spec: LaunchSpec, run_dir: Path, per_rank: int) -> str:
        task = [self._python, "-I", "-S", str(TASK), str(run_dir), str(spec.job_dir), "--", *spec.command]
        pick_port = ("import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])")
        return "\n".join([
            "#!/bin/bash",
            f"# trainyard job {spec.job_id}, attempt {spec.attempt}: every rank in one srun step",
            'MASTER_ADDR=$(scontrol show node "$SLURMD_NODENAME" -o 2>/dev/null | tr " " "\\n" '
            '| sed -n "s/^NodeAddr=//p")',
            'export MASTER_ADDR="${MASTER_ADDR:-$(hostname)}"',
            f"export MASTER_PORT=$({shlex.quote(self._python)} -c {shlex.quote(pick_port)})",
            f"export TRAINYARD_GPUS_PER_RANK={per_rank}",
            # --kill-on-bad-exit=0: a failed rank does not take the others down; the control loop decides.
            "exec srun --kill-on-bad-exit=0 --unbuffered " + " ".join(shlex.quote(a) for a in task),
            "",
        ])

    def _await_ranks(self, att: _Attempt) -> None:
        where = f"job {att.job_id} attempt {att.attempt}"
        deadline = time.monotonic() + self._launch_timeout_s
        while True:
            recs = [read_json(att.run_dir / f"rank-{r}.json") for r in range(att.world_size)]
            for r, rec in enumerate(recs):
                if rec is not None and rec.get("error"):
                    raise BackendError(f"{where}: rank {r}: {rec['error']}")
            if all(rec is not None for rec in recs):
                return
            states = self._job_states([att.slurm_id])
            state = None if states is None else states.get(att.slurm_id)  # None: not known (yet)
            if state is not None and state not in ACTIVE_JOB_STATES:
                tail = _tail(att.run_dir / "batch.log")
                raise BackendError(f"{where}: the Slurm job {att.slurm_id} ended ({state}) before every rank "
                                   f"started{': ' + tail if tail else ''}")
            if time.monotonic() > deadline:
                waiting = [r for r, rec in enumerate(recs) if rec is None]
                raise BackendError(f"{where}: ranks {waiting} did not start in {self._launch_timeout_s:.0f}s "
                                   f"(Slurm job {att.slurm_id} is {state or 'unknown'})")
            time.sleep(0.05)

    def signal(self, job_id: int, attempt: int, sig: int) -> None:
        """`scancel --signal`: every task of the attempt's step gets `sig`; gone is fine."""
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                return
            if sig == _signal.SIGKILL:
                (att.run_dir / "killed").touch(exist_ok=True)
            name = _signal.Signals(sig).name.removeprefix("SIG")
            self._run("scancel", f"--signal={name}", str(att.slurm_id), check=False)

    def poll(self) -> list[AttemptState]:
        with self._lock:
            if not self._attempts:
                return []
            states = self._job_states([a.slurm_id for a in self._attempts.values()])
            if states is None:
                raise BackendError("slurm: `squeue` did not answer; the attempts' states are unknown this time")
            nodes = self._nodes()
            down = {n for n, kv in nodes.items() if not node_health(kv.get("State", "UNKNOWN"))[0]}
            return [AttemptState(a.job_id, a.attempt, [self._rank_state(a, r, states.get(a.slurm_id), down)
                                                       for r in range(a.world_size)])
                    for _, a in sorted(self._attempts.items())]

    def _rank_state(self, att: _Attempt, r: int, job_state: str | None, down: set[str]) -> RankState:
        rec = read_json(att.run_dir / f"rank-{r}.json")
        pid = rec["pid"] if rec else None
        ex = read_json(att.run_dir / f"rank-{r}.exit")
        if ex is not None:
            return RankState(r, pid, running=False, exit_code=ex.get("exit_code"), signal=ex.get("signal"))
        try:
            node = (att.run_dir / f"rank-{r}.node").read_text().strip() or att.nodes.get(r)
        except OSError:
            node = att.nodes.get(r)
        if node in down:
            return RankState(r, pid, running=False, exit_code=None, signal=None, lost=True)
        if job_state in ACTIVE_JOB_STATES:
            return RankState(r, pid, running=True, exit_code=None, signal=None, stopped=job_state == "STOPPED")
        if (att.run_dir / "killed").exists() or job_state == "CANCELLED":
            return RankState(r, pid, running=False, exit_code=None, signal=int(_signal.SIGKILL))
        return RankState(r, pid, running=False, exit_code=None, signal=None, lost=True)

    def check_node(self, name: str) -> tuple[bool, str]:
        kv = self._nodes(max_age_s=0).get(name)
        if kv is None:
            return False, f"Slurm does not know {name!r}"
        healthy, why = node_health(kv.get("State", "UNKNOWN"))
        return (True, f"{name} is {kv.get('State')} in Slurm") if healthy else (False, f"{name} is {why} in Slurm")

    def release(self, job_id: int, attempt: int) -> None:
        """Cancel the batch job (whatever is left of it) and forget the run state (logs stay)."""
        with self._lock:
            att = self._attempts.pop((job_id, attempt), None)
            if att is None:
                return
            self._cancel(att)
            shutil.rmtree(att.run_dir, ignore_errors=True)
            try:
                att.run_dir.parent.rmdir()
            except OSError:
                pass

    def _cancel(self, att: _Attempt, wait_s: float = 2.0) -> None:
        """Kill every process of the batch job and cancel it. Slurm finishes that on its own
        (COMPLETING, epilog): wait only briefly, the control loop must not stall on it."""
        self._run("scancel", "--full", "--signal=KILL", str(att.slurm_id), check=False)
        self._run("scancel", str(att.slurm_id), check=False)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            states = self._job_states([att.slurm_id])
            if states is not None and states.get(att.slurm_id) not in ACTIVE_JOB_STATES:
                return  # gone, or ended
            time.sleep(0.1)

    def close(self) -> None:
        """Forget everything; Slurm keeps running the jobs and the next owner re-attaches."""
        with self._lock:
            self._attempts.clear()

    def _discover(self) -> None:
        for run_dir in JobDir.attempt_runs(self._data_dir):
            meta = read_json(run_dir / "attempt.json")
            if not meta or "slurm_job_id" not in meta:
                continue
            self._attempts[(int(meta["job_id"]), int(meta["attempt"]))] = _Attempt(
                int(meta["job_id"]), int(meta["attempt"]), run_dir, int(meta["world_size"]), int(meta["slurm_job_id"]),
                nodes={int(x["rank"]): str(x["node"]) for x in meta.get("ranks", [])})


def require_commands(env: Mapping[str, str] | None = None) -> None:
    """Raises BackendError unless Slurm's client commands are on PATH."""
    path = (env if env is not None else os.environ).get("PATH")
    for cmd in ("sbatch", "squeue", "scancel", "scontrol"):
        if shutil.which(cmd, path=path) is None:
            raise BackendError(f"slurm backend: `{cmd}` is not on PATH (install Slurm's client commands)")


def _create(data_dir: Path, nodes: list[NodeInfo], options: Mapping[str, object]) -> SlurmBackend:
    partition = options.get("partition")
    return SlurmBackend(data_dir, partition=str(partition) if partition else None,
                        gpu_mem_mib={n.name: n.gpu_mem_mib for n in nodes})


def _discover_nodes(data_dir: Path, options: Mapping[str, object]) -> list[NodeInfo]:
    return _create(data_dir, [], options).inventory()


registry.register(registry.BackendKind(
    "slurm", "an existing Slurm cluster, through sbatch/squeue/scancel/scontrol", _create, _discover_nodes,
    options=frozenset({"partition"}), check=lambda options: require_commands()))


def _tail(path: Path, n: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return ""
