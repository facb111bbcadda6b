"""The in-job tools (`srun`, `scontrol`, `squeue`, `sinfo`) as a job's owner runs them, and the
check that it can.

Why: a batch script runs as its owner, and its `srun` is ours. The plane's own interpreter and
source tree may live where no other account enters (a pyenv or a venv under /root, mode 0700):
a shim that ran `sys.executable …/trainyard/backends/local/srun.py` failed for every owner but
root. So the tools are standard library only and self-contained (they import nothing of
trainyard but `contracts.py`, which is standard library only too), and each attempt gets its own
copy, the plane's (root's, files 0644 in 0755 directories, so the owner may read and not change
them), run by an interpreter every owner can execute, `job_python`:

    <run-dir>/tools/trainyard/contracts.py                  the job environment, hostlists
    <run-dir>/tools/trainyard/backends/rundir/by_path.py    loads contracts.py beside the tools
    <run-dir>/tools/trainyard/backends/local/*.py           srun, scontrol, squeue, sinfo, jobview, ...
    <run-dir>/bin/<tool>                                     #!/bin/sh
                                                             exec JOB_PYTHON -I -S …/local/<tool>.py RUN_DIR "$@"

`job_python`: the configuration's `job_python` (or `yard up --job-python`), else the first of
`CANDIDATES` that exists, else the plane's own interpreter. Any Python 3.8 or newer will do.

`check` is what `yard up` runs before it starts (as root): the chosen interpreter and a copy of the
tools in a fresh directory every account may enter, run as each account jobs may run as (`nobody`
and the configuration's `run_as` and `users:` accounts), `local/srun.py --version`; a failure is
a `JobToolsError` saying what to fix (the directory that does not let the account in, and an
interpreter that would do).
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from trainyard import jobfs
from trainyard.backends.base import BackendError
from trainyard.contracts import CANNOT_EXECUTE_EXIT

PKG = Path(__file__).resolve().parents[2]  # plane's own: the package's directory
# The files an attempt's tools are made of, by their path under the package.
FILES = ("contracts.py", "backends/rundir/by_path.py", "backends/local/srun.py", "backends/local/scontrol.py",
         "backends/local/jobview.py", "backends/local/squeue.py", "backends/local/sinfo.py",
         "backends/local/step_container.py", "backends/local/node_name.py", "spec/image_ref.py", "spec/container_mounts.py",
         "spec/container_flags.py")
# What the Slurm backend's rank wrapper is made of (`slurm.py` runs `slurm/task.py` as the owner on
# every node, with job_python): copied into each attempt's run dir as the tools are.
SLURM_TASK_FILES = ("contracts.py", "backends/rundir/by_path.py", "backends/rundir/rank_runner.py", "backends/slurm/task.py")
TOOLS = {"srun": "backends/local/srun.py", "scontrol": "backends/local/scontrol.py",
         "squeue": "backends/local/squeue.py", "sinfo": "backends/local/sinfo.py"}
CANDIDATES = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3", "/usr/bin/python")
TOOLS_DIR = "tools"
BIN_DIR = "bin"
PROBE_TIMEOUT_S = 20.0
PROBE_ACCOUNTS_MAX = 16  # accounts probed at start, at most (each is one interpreter start)


class JobToolsError(BackendError):
    """Job owners cannot run the in-job tools; the message says what to fix."""


def default_python() -> str:
    """The first of `CANDIDATES` that is an executable file, else the plane's own interpreter."""
    for c in CANDIDATES:
        if os.path.isfile(c) and os.access(c, os.X_OK):  # plane's own: the host's interpreters
            return c
    return sys.executable


def resolve(configured: str | None) -> str:
    """`job_python` as configured, else `default_python()`."""
    return configured or default_python()


def _sources(files: tuple[str, ...] = FILES) -> dict[str, bytes]:
    out = {}
    for rel in files:
        with open(PKG / rel, "rb") as f:  # plane's own: the package's own files
            out[rel] = f.read()
    return out


def install(run_dir: Path, python: str, in_container: bool = False) -> None:
    """The tools and their shims in `run_dir` (the plane's, made through no link; see the module
    docstring). The shims' `bin/` is made here. `in_container`: the script runs in the job's image
    (`LaunchSpec.container`), where the plane's `python` may not exist: the shims fall back to
    the image's `python3` on PATH (the tools need only Python 3.8 or newer and the standard library).

    Raises:
        OSError: one cannot be written.
    """
    copy_files(run_dir, FILES)
    run = jobfs.Tree(run_dir)
    run.make_dir(BIN_DIR, 0o755, exist_ok=False)
    for name in TOOLS:
        run.create_file(f"{BIN_DIR}/{name}", shim(run_dir, name, python, in_container).encode(), 0o755,
                        exist_ok=False)


def copy_files(run_dir: Path, files: tuple[str, ...]) -> None:
    """Copies of the package's `files` (paths under the package) in `<run_dir>/tools/trainyard/`,
    the plane's (files 0644 in 0755 directories: the owner reads and runs them, never changes
    them), made through no link. Why a copy: the package itself may be where owners cannot enter.

    Raises:
        OSError: one cannot be written (or `tools/` is there already).
    """
    run = jobfs.Tree(run_dir)
    dirs = {TOOLS_DIR, f"{TOOLS_DIR}/trainyard"} | {f"{TOOLS_DIR}/trainyard/{p}" for rel in files for p in _parents(rel)}
    for d in sorted(dirs):  # parents before children
        run.make_dir(d, 0o755, exist_ok=False)
    for rel, data in _sources(files).items():
        run.create_file(f"{TOOLS_DIR}/trainyard/{rel}", data, 0o644, exist_ok=False)


def _parents(rel: str) -> list[str]:
    """`backends/local/srun.py` → [`backends`, `backends/local`]."""
    parts = rel.split("/")[:-1]
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def copied(run_dir: Path, rel: str) -> Path:
    """Where `copy_files` puts the package's file `rel` in `run_dir`."""
    return run_dir / TOOLS_DIR / "trainyard" / rel


def shim(run_dir: Path, name: str, python: str, in_container: bool = False) -> str:
    """`bin/<name>`: exec the tool by `python` with -I -S (nothing of the job's environment, no
    site-packages, can change how it runs), and the run dir as its first argument. An
    interpreter the owner cannot execute is said in words (exit 126), never a bare shell error.
    `in_container`: when `python` is not in the image, the first `python3` on PATH runs it."""
    tool = copied(run_dir, TOOLS[name])
    exe = shlex.quote(python)
    if in_container:
        return (f"#!/bin/sh\n"
                f"p={exe}\n"
                f"[ -x \"$p\" ] || p=$(command -v python3) || {{\n"
                f"  echo \"{name}: error: trainyard's in-job tools need a python3 in the job's image (neither "
                f"{python} nor python3 on PATH is there)\" >&2\n"
                f"  exit {CANNOT_EXECUTE_EXIT}\n}}\n"
                f"exec \"$p\" -I -S {shlex.quote(str(tool))} {shlex.quote(str(run_dir))} \"$@\"\n")
    return (f"#!/bin/sh\n"
            f"if [ ! -x {exe} ]; then\n"
            f"  echo \"{name}: error: trainyard's in-job tools run with job_python {python}, which $(id -un) cannot "
            f"execute (permission denied or missing): the cluster's admin sets job_python\" >&2\n"
            f"  exit {CANNOT_EXECUTE_EXIT}\nfi\n"
            f"exec {exe} -I -S {shlex.quote(str(tool))} {shlex.quote(str(run_dir))} \"$@\"\n")


# -- the check at start ------------------------------------------------------------------------------


def accounts_to_probe(run_as: str | None, users: Iterable[str]) -> list[str]:
    """`nobody` (an account with no rights of its own), then `run_as` and the `users:` accounts
    that exist here, at most PROBE_ACCOUNTS_MAX; root is never probed (it reaches everything)."""
    out = []
    for name in ("nobody", run_as, *users):
        if not name or name in out:
            continue
        try:
            if pwd.getpwnam(name).pw_uid == 0:
                continue
        except KeyError:
            continue
        out.append(name)
    return out[:PROBE_ACCOUNTS_MAX]


def _blocked(path: str, uid: int, gids: set[int]) -> str | None:
    """The first directory on the way to `path` that the account cannot search, with its mode."""
    parts = []
    p = os.path.abspath(path)
    while (parent := os.path.dirname(p)) != p:
        parts.append(parent)
        p = parent
    for d in reversed(parts):
        try:
            st = os.stat(d)  # plane's own: the way to an interpreter of the host
        except OSError:
            return f"{d} does not exist"
        bits = 0o100 if st.st_uid == uid else 0o010 if st.st_gid in gids else 0o001
        if not st.st_mode & bits:
            return f"{d} is {st.st_mode & 0o7777:04o} ({_owner_name(st.st_uid)}'s)"
    return None


def _owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _run_as(account: str | None, argv: list[str]) -> subprocess.CompletedProcess:
    kw: dict = {}
    if account is not None:
        pw = pwd.getpwnam(account)
        kw = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": os.getgrouplist(account, pw.pw_gid)}
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}  # never the plane's own environment
    return subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, cwd="/", env=env, **kw)


def probe(python: str, account: str | None, staged: Path) -> str | None:
    """None when `account` (None: this process's own) runs `python` and the tools staged in
    `staged` (`--version`); else what went wrong, in words."""
    srun = staged / "trainyard" / TOOLS["srun"]
    try:
        out = _run_as(account, [python, "-I", "-S", str(srun), "--version"])
    except (OSError, subprocess.SubprocessError) as e:
        return f"{python}: {getattr(e, 'strerror', None) or e}"
    if out.returncode != 0 or "trainyard" not in out.stdout:
        return (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1][:500]
    return None


def _stage() -> Path:
    """A fresh copy of the tools in a directory every account may enter (removed by the caller)."""
    d = Path(tempfile.mkdtemp(prefix="trainyard-tools-"))
    d.chmod(0o755)  # plane's own: made just now
    for rel, data in _sources().items():
        target = d / "trainyard" / rel
        target.parent.mkdir(parents=True, exist_ok=True)  # plane's own: inside the fresh dir
        target.parent.chmod(0o755)  # plane's own
        target.write_bytes(data)  # plane's own
        target.chmod(0o644)  # plane's own
    return d


def check(python: str, accounts: list[str], configured: bool) -> None:
    """Can every one of `accounts` (empty, or a plane that is not root: this process itself) run
    the tools with `python`? See the module docstring.

    Raises:
        JobToolsError: one cannot; the message names the account, the cause and the fix.
    """
    staged = _stage()
    try:
        who: list[str | None] = list(accounts) if os.geteuid() == 0 and accounts else [None]
        for account in who:
            problem = probe(python, account, staged)
            if problem is None:
                continue
            name = account or _owner_name(os.geteuid())
            why = problem
            if account is not None:
                pw = pwd.getpwnam(account)
                real = os.path.realpath(python)  # plane's own: a host interpreter, and the links to it
                blocked = _blocked(real, pw.pw_uid, set(os.getgrouplist(account, pw.pw_gid)))
                if blocked is not None:
                    why = (f"it is {real}, and " if real != os.path.abspath(python) else "") + blocked
            better = next((c for c in CANDIDATES if c != python and os.path.isfile(c)  # plane's own
                           and probe(c, account, staged) is None), None)
            fix = (f"set job_python: {better} in the cluster configuration (or yard up --job-python {better})"
                   if better else "install a python3 (3.8 or newer) every account may execute and set job_python "
                   "to it in the cluster configuration (or yard up --job-python)")
            where = "job_python" if configured else "the plane's interpreter" if python == sys.executable else "job_python"
            raise JobToolsError(f"job owners cannot execute {python} ({where}), which runs srun/scontrol/squeue/"
                                f"sinfo inside batch jobs: as {name}: {why}; {fix}")
    finally:
        shutil.rmtree(staged, ignore_errors=True)  # plane's own: made above
