"""`yard srun --pty [options] CMD ARGS…`: an allocation and one interactive step in one go, as Slurm's
`srun --pty` run outside an allocation (issue 38).

The allocation is `yard alloc`'s (cli/alloc.py: the same options, the same wait, lines starting
`srun:` as Slurm's srun writes them), of kind "srun"; its session is CMD on the first node, and its
end ends the allocation: `yard srun` exits with CMD's status (a nonzero one leaves the job FAILED
with that exit code). Without `--pty` it is refused (exit 2): a batch step is `yard submit -- CMD`
(sbatch), and inside a job the job's own `srun` starts tasks.
"""

from __future__ import annotations

from typing import Any

import typer

from trainyard.cli import alloc, jobs
from trainyard.cli.common import fail
from trainyard.cli.shared_options import with_options


@with_options(jobs.job_request, drop=(*alloc.NOT_OPTIONS, *alloc.BATCH_ONLY))
def srun(ctx: typer.Context,
         pty: bool = typer.Option(False, "--pty", help="run CMD on a terminal (required: yard srun makes only "
                                  "interactive steps; batch work is yard submit)"),
         **options: Any) -> None:
    """`srun --pty CMD`: an allocation (as yard alloc) whose one step is CMD on a terminal on its first node,
    as you, with the job's environment; the allocation ends with it and yard srun exits with its status.
    Without --pty: refused; use `yard submit -- CMD` for a batch job."""
    if not pty:
        fail("yard srun runs an interactive step only: give --pty (for a batch job use `yard submit -- CMD`, "
             "as sbatch; inside a job its own srun starts tasks)")
    cmd = list(ctx.args)
    if not cmd:
        fail("--pty: give the command to run, e.g. yard srun --pty -G 1 bash")
    raise typer.Exit(alloc.allocate("srun", cmd, options, tool="srun"))
