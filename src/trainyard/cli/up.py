"""`yard up`: the control plane in the foreground — REST API, store, control loop and local backend.

Stopping it (Ctrl-C, SIGTERM) stops the API and the loop but leaves running jobs alone, as
restarting slurmctld does: the next `yard up` on the same data dir re-attaches them.
"""

from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path
from typing import Optional

import typer

from trainyard.cli.common import fail


def up(
    config: Optional[Path] = typer.Option(None, "--config", help="cluster configuration (YAML); default: this machine"),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="where the store, tokens and job dirs live "
                                            "(default: $YARD_DATA_DIR or ~/.trainyard)"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
    port: int = typer.Option(8642, "--port", min=0, max=65535, help="port (0: any free one)"),
    nodes: Optional[int] = typer.Option(None, "--nodes", min=1, max=64, help="emulate this many nodes on this machine"),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", min=1, max=64,
                                                help="GPUs per emulated node (default: NVML's, else 4)"),
    db: Optional[str] = typer.Option(None, "--db", help="postgresql://user@host/db, without a password (the "
                                     "command line is readable by every account); default: $YARD_DB_URL, else "
                                     "SQLite in the data dir"),
    db_file: Optional[Path] = typer.Option(None, "--db-file", help="a file (yours, mode 0600, not a link) holding "
                                           "the store's URL, password and all"),
    tick: float = typer.Option(1.0, "--tick", min=0.05, max=60, help="seconds between scheduling passes when idle"),
    backend: str = typer.Option("local", "--backend", help="a backend of trainyard.backends.registry: local "
                                "(processes on this machine), slurm (an existing Slurm cluster, through "
                                "sbatch/squeue/scancel/scontrol)"),
    partition: Optional[str] = typer.Option(None, "--partition", help="with --backend slurm: the partition "
                                            "trainyard's jobs go to (default: Slurm's default)"),
    policy: Optional[str] = typer.Option(None, "--policy", help="scheduling policy to run (trainyard, or a "
                                         "baseline: fifo, slurm, kueue, tiresias, partition); stored as a new "
                                         "configuration version (scheduler.policy) when it changes"),
    wait_ready: bool = typer.Option(False, "--wait-ready", help="start the plane in the background (its output "
                                    "in DATA_DIR/up.log) and return once /readyz answers, like `pg_ctl start -w`: "
                                    "exit 0 ready, 1 when it failed to start"),
    ready_timeout: float = typer.Option(120.0, "--ready-timeout", min=1, help="with --wait-ready: seconds to wait"),
    run_as: Optional[str] = typer.Option(None, "--run-as", help="the Unix account of token users that have "
                                         "none of their own (the configuration's run_as; stored as a new "
                                         "configuration version when it changes)"),
    allow_root_jobs: bool = typer.Option(False, "--allow-root-jobs", help="let jobs run as root (the "
                                         "configuration's allow_root_jobs; stored as a new version)"),
    jobs_dir: Optional[Path] = typer.Option(None, "--jobs-dir", help="keep job dirs (checkpoints, logs) here, on "
                                            "another file system than the store's: DATA_DIR/jobs becomes a link "
                                            "to it (kept for later starts)"),
    login_socket: Optional[str] = typer.Option(None, "--login-socket", help="the Unix socket where `yard login` "
                                               "gets a token for the calling account (default, as root: "
                                               "/run/trainyard/plane-PORT.sock; 'none': no socket)"),
    config_wins: bool = typer.Option(False, "--config-wins", help="store --config's file even when the stored "
                                     "configuration has changes made since the file was last given (yard teams "
                                     "set, yard cluster apply): without it yard up refuses, showing the diff"),
    job_python: Optional[Path] = typer.Option(None, "--job-python", help="the interpreter batch jobs' srun/scontrol/"
                                              "squeue/sinfo (Slurm backend: the rank wrapper) run with, as the "
                                              "job's owner (over the configuration's job_python; default: the "
                                              "host's /usr/bin/python3); yard up checks that job accounts can "
                                              "execute it"),
) -> None:
    """Start the control plane: API, store, control loop and a backend (local by default, or Slurm)."""
    import os

    from trainyard.store import url as store_url

    try:  # before anything is written or started, --wait-ready's background plane included
        db = store_url.resolve(db, None if db_file is None else str(db_file), os.environ)
    except store_url.UrlError as e:
        fail(str(e))
    if wait_ready:  # the background plane reads the URL as this one did (never from a command line)
        from trainyard.cli.serve import start_and_wait
        from trainyard.defaults import default_data_dir

        raise typer.Exit(start_and_wait(sys.argv, data_dir or default_data_dir(), ready_timeout))
    import uvicorn

    from trainyard.cli.serve import GRACEFUL_S, KEEP_ALIVE_S, GracefulServer
    from trainyard.control.loop.orchestrator import LoopParams
    from trainyard.control.lifecycle.plane_builder import PlaneSettings, build_plane
    from trainyard.defaults import default_data_dir
    from trainyard.spec.models import ConfigError, load_config

    if job_python is not None and not job_python.is_absolute():
        fail(f"--job-python: {job_python} is not an absolute path (jobs run it from their own working directory)")
    if policy is not None:
        from trainyard.sched.policy import policy_names

        if policy not in policy_names():
            fail(f"--policy: unknown policy {policy!r}; known: {', '.join(policy_names())}")
    text = given = None
    if config is not None:
        try:
            given = load_config(config).scheduler
            text = config.read_text()
        except ConfigError as e:
            fail(str(e))
    if gpus_per_node is not None and nodes is None:
        nodes = 1
    if config is not None and nodes is not None:
        fail("--nodes/--gpus-per-node describe an emulated cluster; give them or --config, not both")
    from trainyard.backends import registry

    if backend not in registry.names():
        fail(f"--backend: expected one of {', '.join(registry.names())}, got {backend!r}")
    kind = registry.get(backend)
    if nodes is not None and "nodes" not in kind.options:
        fail(f"--nodes/--gpus-per-node emulate nodes on this machine; with --backend {backend} the nodes are "
             f"the backend's own ({kind.summary})")
    if partition is not None and "partition" not in kind.options:
        takes = [n for n in registry.names() if "partition" in registry.get(n).options]
        fail(f"--partition goes with --backend {' or '.join(takes)}")
    # Read once: no process this plane starts (a job, a check, a Slurm command) inherits the URL.
    os.environ.pop(store_url.ENV_VAR, None)
    # IPPROTO_TCP named explicitly: uvicorn sets TCP_NODELAY only on sockets that say so, and
    # without it every response waits ~40 ms for a delayed ACK.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        fail(f"--port: cannot listen on {host}:{port}: {e.strerror or e}")
    # Listening from here on: server.json names this address before uvicorn serves it, and a client
    # that reads it at once (the demo, a script) is queued by the kernel rather than refused.
    sock.listen(2048)
    port = sock.getsockname()[1]
    url = f"http://{host if ':' not in host else '[' + host + ']'}:{port}"
    from trainyard.backends.base import BackendError
    from trainyard.backends.rundir.job_tools import JobToolsError
    from trainyard.control.lifecycle.plane_files import JobsDirError, jobs_dir_note
    from trainyard.services.errors import ServiceError

    try:
        cp = build_plane(PlaneSettings(
            data_dir or default_data_dir(), db_url=db, config_text=text, loop_params=LoopParams(tick_s=tick),
            api_url=url, backend_kind=backend, policy=policy, run_as=run_as,
            backend_options={"nodes": nodes, "gpus_per_node": gpus_per_node, "partition": partition,
                             "job_python": str(job_python) if job_python is not None else None},
            allow_root_jobs=True if allow_root_jobs else None,
            jobs_dir=jobs_dir.expanduser().absolute() if jobs_dir is not None else None,
            config_name=str(config) if config is not None else "the file", config_wins=config_wins))
    except JobToolsError as e:  # job owners could not run srun/scontrol in their batch scripts
        fail(str(e))
    except JobsDirError as e:
        fail(f"--jobs-dir: {e}")
    except BackendError as e:
        fail(f"--backend {backend}: {e}")
    except ServiceError as e:  # the configuration names an account or group this machine lacks, a stale file, …
        fail(f"{config}: {e.message}" if config is not None else e.message)
    for finding in cp.audit:  # work on disk the store does not know (control/lifecycle/store_audit.py)
        typer.echo(f"warning: {finding.message}", err=True)
    with cp.store.session() as s:
        cfg = cp.configs.current(s)
    for note in cfg.spec.scheduler.deprecations():  # the flat parameter names of before the groups
        typer.echo(f"warning: configuration version {cfg.version}: {note}", err=True)
    if (cp.policy_change is not None and cp.policy_change[1]) or (
            given is not None and policy is not None and given.policy != policy and given.params):
        where = f"{config}" if cp.policy_change is None else f"version {cfg.version - 1}"
        typer.echo(f"--policy {policy}: scheduler.params were for another policy and are not carried over "
                   f"(they stay in {where})", err=True)
    from trainyard.api.app import create_app as _app
    from trainyard.control.lifecycle import login_socket as ls

    app = _app(cp)
    sock_path = ls.default_path(port) if login_socket is None and os.geteuid() == 0 else \
        None if login_socket in (None, "none") else Path(login_socket).absolute()
    try:  # the kernel says who calls (control/lifecycle/login_socket.py)
        login_server = None if sock_path is None else \
            ls.LoginSocket(sock_path, ls.plane_answer(cp)).start(create_dir=sock_path.parent == ls.RUN_DIR)
    except (ls.LoginSocketError, OSError) as e:
        if login_socket is not None:
            fail(f"--login-socket: {e}")
        typer.echo(f"warning: no login socket ({e}); `yard login --code` still works, or give --login-socket PATH",
                   err=True)
        sock_path = login_server = None
    app.state.login_socket = None if sock_path is None else str(sock_path)
    cp.write_server_file(url)
    cp.start()
    typer.echo(f"trainyard control plane at {url}  (API docs {url}/docs, dashboard {url}/ui/)")
    typer.echo(f"policy {cfg.spec.scheduler.policy}, configuration version {cfg.version}")
    typer.echo(f"data dir {cp.data_dir}; admin token in {cp.data_dir / 'admin.token'}")
    typer.echo(jobs_dir_note(cp.data_dir))
    for note in cp.notes:  # who jobs run as (services/owners.py)
        typer.echo(note)
    typer.echo(getattr(cp.backend, "containment_line", f"containment: {cp.backend.name}'s own"))
    typer.echo(f"yard login: {sock_path} (the caller's Unix account is its identity) and one-time codes"
               if sock_path is not None else "yard login: one-time codes only (no --login-socket)")
    server = GracefulServer(uvicorn.Config(app, log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=GRACEFUL_S, timeout_keep_alive=KEEP_ALIVE_S), cp)
    # A stop asked for from here on is the server's to carry out (`handle_exit` sets its flag, which
    # uvicorn honours even before it serves), and uvicorn re-raises the signal once it has shut down:
    # the same handler then only sets the flag again, and the `finally` below stops the loop and
    # removes server.json. The handler used to raise SystemExit: a SIGTERM landing in a weakref
    # callback (where exceptions are ignored) before uvicorn took the signals over was lost, and
    # the plane ran on (3 of 12 quick stops on a loaded machine never ended).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, server.handle_exit)
    try:
        server.run(sockets=[sock])
    finally:
        cp.stop()
        if login_server is not None:
            login_server.close()
        cp.remove_server_file()
        typer.echo("trainyard stopped; running jobs keep running and are re-attached by the next `yard up`")


def demo(out: Path = typer.Option(Path(".demo-out"), "--out", help="where the demo's data dir and summary go"),
         live: Optional[bool] = typer.Option(None, "--live/--no-live", help="live view (default: when a terminal)")) -> None:
    """Run the demo: an emulated 2-node x 4-GPU cluster, two teams, a mixed workload shown live."""
    from trainyard.demo.run import main

    raise typer.Exit(main(out, live))
