"""pyxis's `--container-*` options by name, and the checks of the two that are plain text, written
once for every place that reads them: `yard submit` and `#SBATCH` (cli/container_opts.py), the API
(services/images.py `ContainerSubmit`) and `srun` inside a batch script (backends/local/step_container.py).

The image and the mounts have parsers of their own (`image_ref.py`, `container_mounts.py`).
Standard library only and no import of the project: the in-job `srun` loads this file by path.
"""

from __future__ import annotations

import re

# options that take a value → the key of a job's `container` (ContainerOptions' field)
VALUED: dict[str, str] = {"--container-image": "image", "--container-mounts": "mounts",
                          "--container-workdir": "workdir", "--container-env": "env"}
# flags → (key, value)
FLAGS: dict[str, tuple[str, bool]] = {
    "--container-mount-home": ("mount_home", True), "--no-container-mount-home": ("mount_home", False),
    "--container-writable": ("writable", True), "--container-readonly": ("writable", False),
    "--container-entrypoint": ("entrypoint", True), "--no-container-entrypoint": ("entrypoint", False),
    "--container-remap-root": ("remap_root", True), "--no-container-remap-root": ("remap_root", False),
}
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}", re.ASCII)


def workdir(raw: str, where: str) -> str:
    """`--container-workdir`'s path (stripped).

    Raises:
        ValueError: not an absolute path inside the container, or with `..` (the message starts with `where`).
    """
    path = raw.strip()
    if not path.startswith("/") or ".." in path.split("/") or "\x00" in path:
        raise ValueError(f"{where}: {raw!r}: an absolute path inside the container, without '..'")
    return path


def env_names(names: list[str], where: str) -> list[str]:
    """`--container-env`'s names, each once, in order.

    Raises:
        ValueError: one is not a variable name (the message starts with `where`).
    """
    bad = next((n for n in names if not ENV_NAME.fullmatch(n)), None)
    if bad is not None:
        raise ValueError(f"{where}: {bad!r} is not a variable name (pyxis's --container-env takes names; "
                         "their values come from the job's environment)")
    return list(dict.fromkeys(names))
