"""Images on the Slurm backend: through pyxis, when the cluster's `srun` has it.

A Slurm site that runs containers has NVIDIA's pyxis (a SPANK plugin: `srun --help` then lists
`--container-image`), and enroot imports the image on each node at the step's start. So where
pyxis is there, a job's container options pass through to the `srun` of its batch script, in
pyxis's own words (`srun_options`), pinned to the digest the plane recorded
(`ContainerLaunch.ref`, in enroot's URI form), with the job dir mounted so the rank wrapper
(`slurm/task.py`, run by the image's `python3`) can write its records; pre-staging is enroot's
(its cache), so `prepare_image` has nothing to pull. Where pyxis is not there, an image cannot
run on this backend: the pull step fails the attempt with a message that says so (the user's
to choose another cluster or no image), never a silent run outside the image.

Standard library only, and no Slurm command is run here but `srun --help` (`has_pyxis`).
"""

from __future__ import annotations

import subprocess

from trainyard.backends.base import ContainerLaunch
from trainyard.spec.image_ref import parse_image

IMAGE_PYTHON = "python3"  # the rank wrapper's interpreter inside an image (stdlib only, -I -S)


def has_pyxis(srun: str, env: dict[str, str]) -> bool:
    """Whether `srun --help` lists pyxis's `--container-image`."""
    try:
        r = subprocess.run([srun, "--help"], env=env, capture_output=True, text=True, timeout=30,
                           stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--container-image" in (r.stdout + r.stderr)[:200_000]


def srun_options(c: ContainerLaunch, mounts_too: list[str]) -> list[str]:
    """pyxis's options for one job step: the pinned image as an enroot URI, the job's mounts plus
    `mounts_too` (the job dir and the workdir, at their own paths), and the job's choices."""
    ref = parse_image(c.ref)
    o = c.options
    mounts = [m.pyxis() for m in o.mounts] + [f"{p}:{p}" for p in dict.fromkeys(mounts_too)]
    out = [f"--container-image={ref.enroot_uri()}"]
    if mounts:
        out.append("--container-mounts=" + ",".join(mounts))
    if o.workdir:
        out.append(f"--container-workdir={o.workdir}")
    if o.env:
        out.append("--container-env=" + ",".join(o.env))
    out.append("--container-mount-home" if o.mount_home else "--no-container-mount-home")
    out.append("--container-writable" if o.writable else "--container-readonly")
    out.append("--container-remap-root" if o.remap_root else "--no-container-remap-root")
    out.append("--container-entrypoint" if o.entrypoint else "--no-container-entrypoint")
    return out
