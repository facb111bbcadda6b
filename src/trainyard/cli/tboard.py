"""`yard tensorboard JOB`: TensorBoard on one job's runtime metrics.

The runtime writes TensorBoard event files next to `metrics.jsonl` (`<job dir>/metrics/tensorboard/`,
every attempt appending to the same run), so `tensorboard --logdir <job dir>` shows a job's loss,
learning rate and throughput across its attempts. This command finds the job's directory in the
local data dir (the one `yard up` uses: `--data-dir`, else $YARD_DATA_DIR or ~/.trainyard), checks
with the control plane that the caller may read the job, and runs TensorBoard on it in the
foreground (Ctrl-C stops it).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Optional

import typer

from trainyard.cli.client import Client, data_dir_of, local_job_dir
from trainyard.cli.common import fail
from trainyard.contracts import JobDir


def logdir_of(job_dir: Path) -> Path | None:
    """The job's TensorBoard directory, if the runtime wrote any events there."""
    tb = JobDir(job_dir).tensorboard
    return tb if tb.is_dir() and any(tb.rglob("events.out.tfevents.*")) else None


def tensorboard(
    job_id: int = typer.Argument(..., help="job id"),
    port: int = typer.Option(6006, "--port", min=0, max=65535, help="port to serve on (0: any free one)"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="the control plane's data dir "
                                           "(default: $YARD_DATA_DIR or ~/.trainyard)"),
    print_only: bool = typer.Option(False, "--print", help="print the tensorboard command instead of running it"),
) -> None:
    """TensorBoard on a job's metrics (loss, learning rate, throughput, all attempts)."""
    job = Client().get(f"/api/v1/jobs/{job_id}")  # exists, and the caller may read it
    jd = local_job_dir(data_dir_of(data_dir), job)
    logdir = logdir_of(jd.root)
    if logdir is None:
        fail(f"job {job_id}: no TensorBoard events under {jd.tensorboard} (the runtime writes "
             "them once the job has logged a step; jobs that do not use trainyard.runtime write none)")
    exe = shutil.which("tensorboard") or str(Path(sys.executable).parent / "tensorboard")
    if not Path(exe).exists():
        fail("tensorboard is not installed (pip install tensorboard)")
    cmd = [exe, "--logdir", str(logdir), "--host", host, "--port", str(port)]
    if print_only:
        typer.echo(" ".join(cmd))
        return
    typer.echo(f"TensorBoard for job {job_id} on http://{host}:{port}/ (Ctrl-C stops it)", err=True)
    os.execv(exe, cmd)
