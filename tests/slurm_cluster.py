"""A real, throwaway multi-node Slurm cluster on this one machine, for tests.

``SlurmCluster(workdir).start()`` runs Debian 12's Slurm 22.05 (packages ``slurm-wlm`` and ``munge``,
installed by ``scripts/slurm-setup.sh``) entirely under ``workdir``, as root, in about 0.5-1.5 s:

* ``munged -F --force`` with its own key, socket, pid, seed and log files (``--force`` because pytest's
  tmp dirs are mode 0700 and munged wants a world-executable socket dir). Slurm finds that socket
  through ``AuthInfo=socket=...`` in slurm.conf, which clients read too: ``SLURM_CONF`` is the whole
  client environment (``env()``).
* ``slurmctld -D`` on ``SlurmctldPort`` and one ``slurmd -D -N <node>`` per node with its own ``Port=``
  on its ``NodeName`` line, ports random in 20000-32767 (below the kernel's ephemeral range), checked
  free by binding them. Debian's build runs several slurmd on one host with ``-N`` (``%n`` in
  SlurmdSpoolDir/SlurmdPidFile/SlurmdLogFile), so no network namespace is needed: every node has
  ``NodeAddr=127.0.0.1 NodeHostname=<this host>`` and ``SlurmctldHost=<host>(127.0.0.1)``; nothing
  needs the host name to resolve. Every task therefore sees ``hostname`` = this host; the node is in
  ``SLURMD_NODENAME``.
* GPUs: ``Gres=gpu:<n>`` per node, gres.conf ``AutoDetect=off`` and
  ``File=<workdir>/dev/<node>/gpu[0-<n-1>]``. Slurm only stat()s those files and wants a character or
  block device (a plain file is logged as an error), so each is ``mknod c 1 3`` (the same device as
  /dev/null; a symlink to /dev/null where mknod is refused). Slurm numbers them by their order: with
  ``--gres=gpu:4`` the batch step gets ``CUDA_VISIBLE_DEVICES=0,1,2,3`` and ``SLURM_JOB_GPUS=0,1,2,3``;
  every task of a plain ``srun`` step gets ``CUDA_VISIBLE_DEVICES``, ``SLURM_STEP_GPUS`` and
  ``GPU_DEVICE_ORDINAL`` ``=0,1,2,3``; ``srun --gpus-per-task=1`` binds one index (0..3) per task.
* ``SelectType=select/cons_tres`` (``CR_Core``), ``ProctrackType=proctrack/pgid``, ``TaskPlugin=task/none``:
  no cgroups. ``SlurmdParameters=config_overrides`` lets a node claim ``cpus_per_node`` CPUs (default 8)
  whatever the machine has. A job is allocated one CPU per node unless asked: give ``sbatch
  --ntasks-per-node=4`` (or ``--exclusive``) or ``srun --ntasks-per-node=4`` inside it fails with "More
  processors requested than permitted". Back-to-back steps may log "Job step creation temporarily
  disabled, retrying (Requested nodes are busy)" while the previous step is released (~1 s).
* Signals: ``scancel --signal=USR1 J`` reaches every task of every step but not the batch shell;
  ``--batch`` only the batch shell (not its children, not the steps); ``--full`` the batch shell, its
  children (srun) and the tasks. Plain ``scancel J`` sends SIGTERM (steps and batch shell), SIGKILL
  after ``KillWait`` (``kill_wait``, default 5 s here, 30 s in Slurm).
* ``scontrol requeue J`` SIGTERMs the job (its output gets "CANCELLED ... DUE TO JOB REQUEUE"), puts it
  back in PENDING with Reason=BeginTime for ``cred_expire`` s (``AuthInfo=...,cred_expire``: default
  10 here, 120 in Slurm), then reruns the batch script with ``SLURM_RESTART_COUNT=1`` and
  ``Restarts=1``; the output file is truncated unless ``--open-mode=append``. ``SchedulerParameters=
  bf_interval=1,sched_interval=1`` so that happens within ~1 s of BeginTime (~12 s in all).
* Node failure: ``SlurmdTimeout`` (``slurmd_timeout``, 10 s) and ``MessageTimeout`` (5 s) with
  ``ReturnToService=2``. ``kill_slurmd(node)`` SIGKILLs that node's slurmd (its job steps keep running,
  as with a slurmd crash; ``steps=True`` kills them too, like a host loss): ``scontrol`` shows
  ``IDLE+NOT_RESPONDING`` after ~10 s and ``DOWN+NOT_RESPONDING`` (``sinfo``: ``down*``) after ~20 s (with
  Slurm's MessageTimeout=10 it takes ~27 s whatever SlurmdTimeout is). A job on a DOWN node ends its
  run as NODE_FAIL and, as a batch job (requeue is the default), goes back to PENDING. ``start_slurmd``
  brings the node back to IDLE by itself within a second.
* Accounting: by default no slurmdbd (in 22.05 its only storage plugin is MySQL/MariaDB), so plain
  ``sacct`` says "Slurm accounting storage is disabled". With ``accounting=True`` the cluster runs
  ``slurmdbd -D`` too (its own port, a database ``slurm_acct_<random>`` on the MariaDB server at
  127.0.0.1:3306 as root without a password, dropped by ``stop()``; ``accounting_available()`` says
  why not when there is none), with ``AccountingStorageEnforce=associations``: ``sacct`` shows each
  job's user and account, and a job whose user has no association with its account is refused at
  submission, as at a real site. ``add_association(user, account)`` is ``sacctmgr add account`` /
  ``add user``. The job completion log (``JobCompType=jobcomp/filetxt``,
  ``self.jobcomp_path``, one line per job end or requeue) is what ``sacct --completion`` reads:
  ``sacct -c -j J -n -P -o JobID,State,ExitCode`` gives ``J|COMPLETED|0:0``. A requeue is logged
  there with State=PENDING. ``scontrol show job`` keeps a finished job for MinJobAge (300 s).
* ``extra_conf`` lines are appended to slurm.conf before the node lines; for a key given twice the
  last one wins.

Files go under ``workdir`` only (and, when its path is over 60 characters, munge's socket and the
slurmd spool dirs go to a short ``/tmp/tyslurm-*`` dir that ``stop()`` removes: unix socket paths must
fit in 108 bytes). ``stop()`` kills every daemon it started, every slurmstepd of this cluster (found
by the slurmd log file they keep open; their /proc environ is wiped by their process title) and
every process under those. Daemons get PR_SET_PDEATHSIG, so they also die with the test process.

Needs root (SlurmUser=root, SlurmdUser=root; slurmd must be root to launch jobs) and Linux /proc.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from tests.setup_once import install_once

REPO = Path(__file__).resolve().parent.parent
SETUP_SCRIPT = REPO / "scripts" / "slurm-setup.sh"
SUBREAPER = Path(__file__).resolve().with_name("slurm_subreaper.py")  # each slurmd runs under it
BINARIES = ("munged", "slurmctld", "slurmd", "slurmdbd", "sinfo", "squeue", "sbatch", "srun", "scontrol", "scancel",
            "sacct", "sacctmgr")
MARIADB = ("127.0.0.1", 3306)  # accounting=True stores Slurm's accounting here (user root, no password)
# JobState values after which a job will not run again (a requeued job goes back to PENDING instead)
TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}
    | {"DEADLINE"}
)
NO_INSTALL_ENV = "TRAINYARD_SLURM_NO_INSTALL"  # set to 1 to never run scripts/slurm-setup.sh from tests

_availability: list[str | None] = []  # memo: [reason] once computed


class SlurmClusterError(RuntimeError):
    """The cluster could not be started, or a client command failed."""


def _which(name: str) -> str | None:
    """Like shutil.which, also looking in the sbin dirs a non-login PATH may lack (the daemons live there)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin"])
    return shutil.which(name, path=path)


def _missing_binaries() -> list[str]:
    return [b for b in BINARIES if _which(b) is None]


def slurm_available() -> str | None:
    """None when a SlurmCluster can run here; otherwise why not (a message for pytest.skip).

    When Slurm's binaries are missing and we are root, runs scripts/slurm-setup.sh once (under a
    file lock, so parallel test workers do not race on dpkg), unless TRAINYARD_SLURM_NO_INSTALL=1.
    """
    if _availability:
        return _availability[0]
    reason = _check_available()
    _availability.append(reason)
    return reason


def _check_available() -> str | None:
    if not Path("/proc/self/fd").is_dir():
        return "Slurm tests need Linux /proc"
    failed = install_once(SETUP_SCRIPT, lambda: bool(_missing_binaries()), NO_INSTALL_ENV)
    missing = _missing_binaries()
    if failed is not None:
        return f"Slurm not installable here: {', '.join(missing)} still missing after scripts/{SETUP_SCRIPT.name} ({failed})"
    if missing:
        how = "set" if os.environ.get(NO_INSTALL_ENV) == "1" else "not set"
        return (
            f"Slurm binaries missing ({', '.join(missing)}); run `sudo scripts/slurm-setup.sh` "
            f"(installs Debian's slurm-wlm and munge; {NO_INSTALL_ENV} is {how})"
        )
    if os.geteuid() != 0:
        return "the Slurm test cluster runs slurmd/slurmctld as root (SlurmUser=root); run the tests as root"
    return None


def accounting_available() -> str | None:
    """None when `SlurmCluster(accounting=True)` can run here, else why not: slurmdbd and the
    mysql client installed, and a MariaDB server answering at MARIADB."""
    missing = [b for b in ("slurmdbd", "sacctmgr", "mysql") if _which(b) is None]
    if missing:
        return f"Slurm accounting needs {', '.join(missing)} (scripts/slurm-setup.sh installs slurmdbd)"
    with socket.socket() as sk:
        sk.settimeout(2)
        if sk.connect_ex(MARIADB) != 0:
            return f"Slurm accounting needs a MariaDB server at {MARIADB[0]}:{MARIADB[1]} (user root, no password)"
    return None


# ---------------------------------------------------------------------------------------------
# processes


try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None


def _set_pdeathsig() -> None:
    """In the child between fork and exec: SIGTERM it if the test process dies without stop()."""
    if _LIBC is not None:
        _LIBC.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG


def _ppid_map() -> dict[int, int]:
    out: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                data = f.read()
        except OSError:
            continue
        rest = data[data.rfind(")") + 2 :].split()
        out[int(d)] = int(rest[1])
    return out


def _descendants(roots: Iterable[int], ppids: dict[int, int] | None = None) -> list[int]:
    ppids = _ppid_map() if ppids is None else ppids
    children: dict[int, list[int]] = {}
    for pid, ppid in ppids.items():
        children.setdefault(ppid, []).append(pid)
    seen: list[int] = []
    todo = list(roots)
    while todo:
        pid = todo.pop()
        for c in children.get(pid, ()):
            if c not in seen:
                seen.append(c)
                todo.append(c)
    return seen


def _pids_holding(paths: Iterable[Path]) -> list[int]:
    """Processes with one of these files open (how this cluster's slurmstepds are found)."""
    wanted = {str(p) for p in paths}
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{d}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{d}/fd/{fd}") in wanted:
                    pids.append(int(d))
                    break
            except OSError:
                continue
    return pids


def _kill(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _free_ports(n: int) -> list[int]:
    """n distinct TCP ports, free now, in 20000-32767 (below the ephemeral range srun/clients use)."""
    ports: list[int] = []
    held: list[socket.socket] = []
    try:
        for _ in range(2000):
            if len(ports) == n:
                break
            port = random.randint(20000, 32767)
            if port in ports:
                continue
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                s.close()
                continue
            held.append(s)
            ports.append(port)
    finally:
        for s in held:
            s.close()
    if len(ports) < n:
        raise SlurmClusterError("no free TCP ports in 20000-32767")
    return ports


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


_live: weakref.WeakSet[SlurmCluster] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for c in list(_live):
        with contextlib.suppress(Exception):
            c.stop()


# ---------------------------------------------------------------------------------------------


class SlurmCluster:
    """munged + slurmctld + one slurmd per node, all under ``workdir``; see the module docstring.

    Use as ``with SlurmCluster(tmp) as c:`` or ``c.start()`` ... ``c.stop()``. Client commands:
    ``c.run("sinfo", "-N")`` or any subprocess with ``env={**os.environ, **c.env()}``.
    """

    def __init__(
        self,
        workdir: Path,
        nodes: Sequence[str] = ("n1", "n2"),
        gpus_per_node: int = 4,
        cpus_per_node: int = 8,
        memory_mb: int = 16384,
        slurmd_timeout: int = 10,
        message_timeout: int = 5,
        kill_wait: int = 5,
        cred_expire: int = 10,
        extra_conf: str = "",
        accounting: bool = False,
        features: Mapping[str, str] | None = None,
        gpu_type: str | None = None,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.nodes = tuple(nodes)
        self.gpus_per_node = gpus_per_node
        self.cpus_per_node = cpus_per_node
        self.memory_mb = memory_mb
        self.slurmd_timeout = slurmd_timeout
        self.message_timeout = message_timeout
        self.kill_wait = kill_wait
        self.cred_expire = cred_expire
        self.extra_conf = extra_conf
        self.accounting = accounting
        self.features = dict(features or {})  # node -> Feature= (comma-separated), for -C tests
        self.gpu_type = gpu_type  # Gres=gpu:<type>:<n> and gres.conf Type=, for GPU-model tests
        self.dbd_port = 0
        self.db_name = f"slurm_acct_{os.urandom(5).hex()}"
        self.hostname = socket.gethostname().split(".")[0]
        self.conf_path = self.workdir / "slurm.conf"
        self.gres_conf_path = self.workdir / "gres.conf"
        self.log_dir = self.workdir / "log"
        self.state_dir = self.workdir / "state"
        self.run_dir = self.workdir / "run"
        self.dev_dir = self.workdir / "dev"
        self.jobcomp_path = self.log_dir / "jobcomp.txt"
        # unix sockets (munge's, slurmstepd's in the spool dir) must fit in 108 bytes
        self._short_dir: Path | None = None
        self.munge_dir = self.workdir / "munge"
        self.spool_dir = self.workdir / "spool"
        self.ctld_port = 0
        self.slurmd_ports: dict[str, int] = {}
        self.gres_files: dict[str, list[Path]] = {}
        self._procs: dict[str, subprocess.Popen] = {}  # "munged", "slurmctld", "slurmd-<node>"
        self.started = False

    # -- public API ----------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """What a client command (sinfo, sbatch, srun, ...) needs on top of os.environ.

        The munge socket is in slurm.conf (AuthInfo=socket=...), so SLURM_CONF is all. A job's
        environment has SLURM_CONF set by slurmd even with ``sbatch --export=NONE`` (which drops
        PATH, though), so ``srun`` inside a job finds this cluster.
        """
        return {"SLURM_CONF": str(self.conf_path)}

    def run(
        self, *args: str, check: bool = True, timeout: float = 60, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a client command (``run("squeue", "-h")``) against this cluster; text output.

        check=True raises SlurmClusterError (with stdout/stderr) on a non-zero exit.
        """
        p = subprocess.run(
            list(args),
            env={**os.environ, **self.env()},
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            cwd=self.workdir,
        )
        if check and p.returncode != 0:
            raise SlurmClusterError(
                f"{' '.join(args)} exited {p.returncode}\nstdout: {p.stdout.strip()}\nstderr: {p.stderr.strip()}"
            )
        return p

    def add_association(self, user: str, account: str) -> None:
        """``sacctmgr``: the account (made if new) and the user's association with it."""
        self.run("sacctmgr", "-i", "add", "account", account, "Cluster=trainyard", check=False)
        self.run("sacctmgr", "-i", "add", "user", user, f"Account={account}", "Cluster=trainyard")
        self.wait_for(lambda: user in self.run("sacctmgr", "-n", "-P", "show", "assoc", f"account={account}",
                                               "format=user").stdout.split(), 20, f"{user}'s association")

    def sbatch(self, *args: str) -> int:
        """``sbatch --parsable *args``; returns the job id."""
        out = self.run("sbatch", "--parsable", *args).stdout.strip()
        return int(out.split(";")[0])

    def node_states(self) -> dict[str, str]:
        """Node -> scontrol state, e.g. {"n1": "IDLE", "n2": "DOWN+NOT_RESPONDING"}."""
        out = self.run("scontrol", "-o", "show", "node").stdout
        states = {}
        for line in out.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if "NodeName" in fields:
                states[fields["NodeName"]] = fields.get("State", "")
        return states

    def node_state(self, node: str) -> str:
        return self.node_states().get(node, "")

    def job_info(self, job_id: int | str) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, Reason, NodeList, ExitCode, Restarts, ...); {} once gone."""
        p = self.run("scontrol", "-o", "show", "job", str(job_id), check=False)
        if p.returncode != 0:
            return {}
        return dict(f.split("=", 1) for f in p.stdout.split() if "=" in f)

    def wait_job(self, job_id: int | str, states: Iterable[str] = TERMINAL_STATES, timeout: float = 60) -> dict[str, str]:
        """Wait until ``scontrol show job`` has JobState in ``states`` (default: ended); returns the job's info."""
        want = set(states)

        def done() -> dict[str, str] | None:
            info = self.job_info(job_id)
            return info if info.get("JobState") in want else None

        what = lambda: f"job {job_id} in {sorted(want)} (now {self.job_info(job_id).get('JobState')})"  # noqa: E731
        return self.wait_for(done, timeout, what)  # type: ignore[return-value]

    def wait_for(
        self, pred: Callable[[], object], timeout: float = 30, what: str | Callable[[], str] = "condition"
    ) -> object:
        """Poll pred every 0.2 s until truthy and return its value; on timeout raise SlurmClusterError
        with ``what`` (a string, or a callable evaluated then) and the daemons' log tails."""
        deadline = time.monotonic() + timeout
        while True:
            v = pred()
            if v:
                return v
            if time.monotonic() > deadline:
                desc = what() if callable(what) else what
                raise SlurmClusterError(f"timed out after {timeout} s waiting for {desc}\n{self.logs_tail()}")
            time.sleep(0.2)

    def wait_nodes(self, state: str = "IDLE", nodes: Iterable[str] | None = None, timeout: float = 30) -> None:
        """Wait until each node's scontrol state is exactly ``state`` (e.g. IDLE) or contains it (NOT_RESPONDING)."""
        want = list(nodes or self.nodes)

        def ok() -> bool:
            st = self.node_states()
            return all(st.get(n) == state or state in st.get(n, "").split("+") for n in want)

        self.wait_for(ok, timeout, lambda: f"nodes {want} {state} (now {self._safe_states()})")

    def kill_slurmd(self, node: str, *, steps: bool = False) -> None:
        """SIGKILL node's slurmd (the node stops responding; DOWN after SlurmdTimeout).

        steps=True also kills that node's slurmstepd processes and their tasks (a host loss).
        """
        p = self._procs.pop(f"slurmd-{node}", None)
        if p is not None:
            _kill([p.pid])
            p.wait(10)
        if steps:
            self._kill_steps([node])

    def start_slurmd(self, node: str) -> None:
        """(Re)start node's slurmd; with ReturnToService=2 a DOWN node returns to service by itself."""
        if node not in self.nodes:
            raise ValueError(f"unknown node {node!r}; nodes are {self.nodes}")
        key = f"slurmd-{node}"
        old = self._procs.get(key)
        if old is not None and old.poll() is None:
            return
        (self.spool_dir / node).mkdir(parents=True, exist_ok=True)
        # Under a subreaper (tests/slurm_subreaper.py): orphans of its steps are reaped at once, as
        # systemd does on a real node; this machine's PID 1 left each batch job 3 s in COMPLETING.
        self._spawn(key, [sys.executable, "-I", "-S", str(SUBREAPER),
                          _which("slurmd") or "slurmd", "-D", "-f", str(self.conf_path), "-N", node])

    def pids(self) -> dict[str, int]:
        """The running daemons: {"munged": pid, "slurmctld": pid, "slurmd-n1": pid, ...}."""
        return {k: p.pid for k, p in self._procs.items() if p.poll() is None}

    def slurmd_running(self, node: str) -> bool:
        p = self._procs.get(f"slurmd-{node}")
        return p is not None and p.poll() is None

    def logs_tail(self, lines: int = 25) -> str:
        """The last lines of every daemon log (for error messages)."""
        parts = []
        if self.log_dir.is_dir():
            for f in sorted(self.log_dir.iterdir()):
                if f.name == self.jobcomp_path.name:
                    continue
                t = _tail(f, lines)
                if t:
                    parts.append(f"--- {f}\n{t}")
        return "\n".join(parts)

    def start(self, timeout: float = 30) -> SlurmCluster:
        """Write the config, start munged, slurmctld and the slurmds; wait until all nodes are idle."""
        if self.started:
            return self
        reason = slurm_available()
        if reason:
            raise SlurmClusterError(reason)
        _live.add(self)
        self.started = True
        try:
            self._write_files()
            self._start_munged()
            if self.accounting:
                self._start_slurmdbd()
            self._spawn("slurmctld", [_which("slurmctld") or "slurmctld", "-D", "-f", str(self.conf_path)])
            for n in self.nodes:
                self.start_slurmd(n)
            self._wait_up(timeout)
        except Exception as e:
            self.stop()  # the logs stay on disk; stop() removes only the short socket dir
            msg = f"Slurm test cluster did not come up: {e}"
            if "\n--- " not in msg:
                msg += f"\n{self.logs_tail()}"
            raise SlurmClusterError(msg) from e
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every process of this cluster: job tasks, slurmstepds, slurmds, slurmctld, munged."""
        if not self.started:
            return
        self._kill_steps(self.nodes)
        daemons = [self._procs.pop(k) for k in [k for k in self._procs if k.startswith("slurmd-")]]
        daemons += [self._procs.pop(k) for k in ("slurmctld", "slurmdbd", "munged") if k in self._procs]
        for p in daemons:  # slurmctld's child slurmscriptd exits with it
            kids = _descendants([p.pid])
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
            _kill(kids)
        self._kill_steps(self.nodes)  # any step a dying slurmd started meanwhile
        self._procs.clear()
        if self.accounting:
            subprocess.run(["mysql", "-uroot", f"-h{MARIADB[0]}", f"-P{MARIADB[1]}", "-e",
                            f"DROP DATABASE IF EXISTS {self.db_name}"], capture_output=True, check=False)
        if self._short_dir is not None:
            shutil.rmtree(self._short_dir, ignore_errors=True)
            self._short_dir = None
        self.started = False
        _live.discard(self)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals -----------------------------------------------------------------------------

    def _safe_states(self) -> object:
        try:
            return self.node_states()
        except Exception as e:  # noqa: BLE001 - only for a message
            return f"<{e}>"

    def _spawn(self, key: str, argv: list[str]) -> None:
        out = open(self.log_dir / f"{key}.stdout", "ab")  # noqa: SIM115 - the child keeps it
        try:
            self._procs[key] = subprocess.Popen(
                argv,
                env={**os.environ, **self.env()},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.log_dir,
                start_new_session=True,
                preexec_fn=_set_pdeathsig,
            )
        finally:
            out.close()

    def _kill_steps(self, nodes: Iterable[str]) -> None:
        logs = [self.log_dir / f"slurmd-{n}.log" for n in nodes]
        for _ in range(3):
            steps = _pids_holding(logs)
            if not steps:
                return
            victims = steps + _descendants(steps)
            _kill(victims, signal.SIGSTOP)  # no more forks while we kill
            _kill(victims + _descendants(victims))
            time.sleep(0.1)

    def _write_files(self) -> None:
        w = self.workdir
        for d in (self.log_dir, self.state_dir, self.run_dir, self.dev_dir):
            d.mkdir(parents=True, exist_ok=True)
        # slurmstepd puts "<spool>/<node>/<host>_<job>.<step>" sockets there; munge its socket
        if len(str(w)) > 60:
            self._short_dir = Path(tempfile.mkdtemp(prefix="tyslurm-"))
            self.munge_dir = self._short_dir / "munge"
            self.spool_dir = self._short_dir / "spool"
        self.munge_dir.mkdir(parents=True, exist_ok=True)
        self.munge_dir.chmod(0o755)  # other accounts' clients (sbatch run as a job's owner) reach the socket
        for n in self.nodes:
            (self.spool_dir / n).mkdir(parents=True, exist_ok=True)

        self.gres_files = {}
        for n in self.nodes:
            nd = self.dev_dir / n
            nd.mkdir(parents=True, exist_ok=True)
            files = [nd / f"gpu{i}" for i in range(self.gpus_per_node)]
            for f in files:
                if f.is_symlink() or f.exists():
                    continue
                try:
                    os.mknod(f, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
                except OSError:
                    f.symlink_to("/dev/null")
            self.gres_files[n] = files

        ports = _free_ports(2 + len(self.nodes))
        self.ctld_port, self.dbd_port = ports[0], ports[1]
        self.slurmd_ports = dict(zip(self.nodes, ports[2:], strict=True))
        (w / "plugstack.conf").write_text("")
        sock = self.munge_dir / "munge.socket"

        g = self.gpus_per_node
        node_lines = "\n".join(
            f"NodeName={n} NodeAddr=127.0.0.1 NodeHostname={self.hostname} Port={self.slurmd_ports[n]} "
            f"CPUs={self.cpus_per_node} RealMemory={self.memory_mb}"
            + (f" Gres=gpu:{self.gpu_type + ':' if self.gpu_type else ''}{g}" if g else "")
            + (f" Feature={self.features[n]}" if self.features.get(n) else "") + " State=UNKNOWN"
            for n in self.nodes
        )
        accounting = (
            f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\n"
            f"AccountingStoragePort={self.dbd_port}\nAccountingStorageEnforce=associations\n"
            f"AccountingStoragePass={sock}"  # the munge socket for talking to slurmdbd
            if self.accounting else "AccountingStorageType=accounting_storage/none"
        )
        conf = f"""\
# written by tests/slurm_cluster.py
ClusterName=trainyard
SlurmctldHost={self.hostname}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock},cred_expire={self.cred_expire}
StateSaveLocation={self.state_dir}
SlurmdSpoolDir={self.spool_dir}/%n
SlurmctldPidFile={self.run_dir}/slurmctld.pid
SlurmdPidFile={self.run_dir}/slurmd-%n.pid
SlurmctldLogFile={self.log_dir}/slurmctld.log
SlurmdLogFile={self.log_dir}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={w}/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
{accounting}
JobCompType=jobcomp/filetxt
JobCompLoc={self.jobcomp_path}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
PreemptMode=OFF
GresTypes=gpu
SlurmdParameters=config_overrides
SlurmdTimeout={self.slurmd_timeout}
MessageTimeout={self.message_timeout}
ReturnToService=2
KillWait={self.kill_wait}
{self.extra_conf}
{node_lines}
PartitionName=main Nodes={",".join(self.nodes)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""
        self.conf_path.write_text(conf)
        if self.accounting:
            dbd = self.workdir / "slurmdbd.conf"  # beside slurm.conf: where slurmdbd looks for it
            dbd.write_text(f"""\
# written by tests/slurm_cluster.py
AuthType=auth/munge
AuthInfo=socket={sock}
DbdAddr=127.0.0.1
DbdHost=localhost
DbdPort={self.dbd_port}
SlurmUser=root
DebugLevel=info
LogFile={self.log_dir}/slurmdbd.log
PidFile={self.run_dir}/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost={MARIADB[0]}
StoragePort={MARIADB[1]}
StorageUser=root
StorageLoc={self.db_name}
""")
            dbd.chmod(0o600)  # slurmdbd refuses a configuration others may read
        gres = ["AutoDetect=off"]
        if g:
            kind = f" Type={self.gpu_type}" if self.gpu_type else ""
            gres += [f"NodeName={n} Name=gpu{kind} File={self.dev_dir / n}/gpu[0-{g - 1}]" for n in self.nodes]
        self.gres_conf_path.write_text("\n".join(gres) + "\n")

    def _start_munged(self) -> None:
        d = self.munge_dir
        key = d / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = d / "munge.socket"
        self._spawn(
            "munged",
            [
                _which("munged") or "munged",
                "-F",
                "--force",  # pytest's tmp dirs are 0700; munged wants the socket dir world-executable
                f"--socket={sock}",
                f"--key-file={key}",
                f"--pid-file={d / 'munged.pid'}",
                f"--seed-file={d / 'munged.seed'}",
                f"--log-file={self.log_dir / 'munged.log'}",
            ],
        )
        p = self._procs["munged"]
        self.wait_for(lambda: sock.exists() or p.poll() is not None, 10, "munged's socket")
        if p.poll() is not None:
            raise SlurmClusterError(f"munged exited {p.returncode}")

    def _start_slurmdbd(self) -> None:
        """slurmdbd, once it answers; then the cluster registered in it (sacctmgr add cluster)."""
        why = accounting_available()
        if why:
            raise SlurmClusterError(why)
        self._spawn("slurmdbd", [_which("slurmdbd") or "slurmdbd", "-D"])
        p = self._procs["slurmdbd"]

        def up() -> bool:
            if p.poll() is not None:
                return True
            with socket.socket() as sk:
                return sk.connect_ex(("127.0.0.1", self.dbd_port)) == 0
        self.wait_for(up, 30, "slurmdbd's port")
        if p.poll() is not None:
            raise SlurmClusterError(f"slurmdbd exited {p.returncode}")
        self.run("sacctmgr", "-i", "add", "cluster", "trainyard")

    def _wait_up(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            for key, p in self._procs.items():
                if p.poll() is not None:
                    raise SlurmClusterError(f"{key} exited {p.returncode}")
            q = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=15)
            if q.returncode == 0:
                states = dict(line.split() for line in q.stdout.splitlines() if len(line.split()) == 2)
                if all(states.get(n) == "idle" for n in self.nodes):
                    return
                last = str(states)
            else:
                last = q.stderr.strip()
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"nodes not idle after {timeout} s (sinfo: {last})")
            time.sleep(0.2)
