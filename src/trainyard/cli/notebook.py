"""`yard notebook [yard alloc's options] [--port LOCAL] [--jupyter CMD]`: JupyterLab in an interactive
allocation, served on a local URL through a forwarded port (issue 38, Deliver 4).

The steps, as a person would take them by hand with `yard alloc`, `jupyter lab` and `yard port-forward`:
1. a local listener first (LOCAL, default a free port), so that the URL is known before the job
   exists; a random token (`secrets.token_urlsafe`) and a port for JupyterLab in the job (REMOTE, at
   random below Linux's ephemeral range, so no client socket on the node holds it);
2. an interactive job of kind "notebook" (`yard submit`'s options, `cli/jobs.py` `job_request`; the
   interactive class unless `-q` says otherwise) whose batch script (`jupyter_script`) starts
   JupyterLab on 127.0.0.1:REMOTE of the allocation's first node, in the job's working directory, as
   the owner, from the job's image or environment (`--jupyter`, default `jupyter lab`: the PATH the
   job gets is the submitting shell's, as sbatch's --export=ALL);
3. the wait for the allocation, as `yard alloc` waits (its state, reason and estimated start);
4. the forwarded port (`cli/port_forward.py`'s `forward`, in this process), then JupyterLab asked
   through it until it answers (`/api/status` with the token) or the job ends (its state, reason
   and the tail of its log; exit 1) or START_TIMEOUT_S passes;
5. `http://127.0.0.1:LOCAL/lab?token=TOKEN` printed on stdout (the only line there), then served
   until Ctrl-C (or SIGTERM/SIGHUP), which releases the allocation (`POST /jobs/{id}/release`:
   COMPLETED) and exits 0; a job that ends meanwhile (its time limit, its idle timeout) is said,
   exit 1.

The token is a secret: whoever has it is the owner inside JupyterLab (a terminal, the owner's files).
The rest of the job's team reads the job's env, command and logs, so the token is in none of them:
the plane keeps it in the job's interactive record, shown whole only to the owner, admins and the
job's own token (services/allocations.py `shown`), and the script reads it from the plane with the
job's token (TRAINYARD_TOKEN, in the rank's environment, which only the owner can read) into
JupyterLab's environment (JUPYTER_TOKEN), never a command line (`ps` shows those to everyone on the
node). JupyterLab prints its URL with `token=...` in place of a token it did not make itself. The
record also carries the local URL, so the dashboard's job page links to it for the owner: a link
that works in a browser on the machine where `yard notebook` runs.

JupyterLab is kept off the network (a cluster's nodes often have none, and a notebook should not
phone home): no news feed, no update check, the read-only extension manager (the default one asks
PyPI at start).
"""

from __future__ import annotations

import secrets
import shlex

from trainyard.contracts import JobVar

REMOTE_PORTS = (20000, 32768)  # JupyterLab's port in the job: [low, high)
START_TIMEOUT_S = 120.0  # from the allocation's start to JupyterLab answering
DEFAULT_JUPYTER = "jupyter lab"

# JupyterLab's options after the command: loopback only (the forwarded port is the way in), this port
# or nothing (the client forwards to it), the job's working directory as its root, no network.
JUPYTER_FLAGS = ("--no-browser", "--ip=127.0.0.1", "--ServerApp.port_retries=0", '--ServerApp.root_dir="$PWD"',
                 "--ServerApp.allow_root=True",  # only matters where the owner is root (a plane's tests)
                 "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                 "--LabApp.extension_manager=readonly")

# Reads the notebook's token from the plane with the job's own token (standard library, any python3).
_READ_TOKEN = ("import json, os, urllib.request as u; "
               f"r = u.Request(os.environ['{JobVar.API}'].rstrip('/') + '/api/v1/jobs/' + os.environ['{JobVar.JOB_ID}'], "
               f"headers={{'Authorization': 'Bearer ' + os.environ['{JobVar.TOKEN}']}}); "
               "print(json.load(u.urlopen(r, timeout=30))['interactive']['token'])")


def remote_port() -> int:
    low, high = REMOTE_PORTS
    return low + secrets.randbelow(high - low)


def new_token() -> str:
    return secrets.token_urlsafe(32)


def lab_url(local_port: int, token: str, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{local_port}/lab?token={token}"


def jupyter_script(jupyter: list[str], port: int) -> str:
    """The notebook job's batch script: JupyterLab (`jupyter`: its command words) on 127.0.0.1:`port`
    with the token read from the plane (see the module docstring). `exec`: JupyterLab is the rank's
    process, its end the job's."""
    words = " ".join([shlex.join(jupyter), *JUPYTER_FLAGS, f"--port={port}"])
    return f"""#!/bin/sh
# trainyard: yard notebook. JupyterLab on 127.0.0.1:{port} of the allocation's first node, in the
# job's working directory, until the allocation ends. Its token is read from the plane with the
# job's own token: it is not in this script, the job's environment, a command line or the log.
JUPYTER_TOKEN=$(python3 -I -c "{_READ_TOKEN}") && [ -n "$JUPYTER_TOKEN" ] || {{
  echo "yard notebook: could not read the notebook's token from the plane at ${JobVar.API}" >&2; exit 1; }}
export JUPYTER_TOKEN
jupyter={shlex.quote(jupyter[0])}
command -v "$jupyter" >/dev/null 2>&1 || {{
  echo "yard notebook: $jupyter not found on the job's PATH ($PATH): install JupyterLab in the job's" \\
       "environment or image, or give --jupyter" >&2; exit 127; }}
exec {words}
"""
