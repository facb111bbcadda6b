"""How the CLI prints a job's image (`yard show`, `yard acct`, `yard queue`): the image as
normalised, the digest its first attempt pinned (every later attempt runs it), and the pyxis
options it was given, in pyxis's own words so a Slurm user reads them back as typed."""

from __future__ import annotations

from typing import Any

from trainyard.spec.container import ContainerOptions

NOT_PINNED = "pinned at its first start"


def short_digest(digest: str | None, width: int = 12) -> str:
    """`sha256:0123456789ab` (the first `width` hex digits, as `docker images` shows an id), or ''."""
    if not digest:
        return ""
    algo, _, hexes = digest.partition(":")
    return f"{algo}:{hexes[:width]}"


def image_line(container: dict[str, Any] | None, digest: str | None) -> str | None:
    """`IMAGE (digest: sha256:…)`, or None for a bare job."""
    if not container or not container.get("image"):
        return None
    return f"{container['image']} (digest: {digest or NOT_PINNED})"


def options_line(container: dict[str, Any] | None) -> str | None:
    """The options other than the image, as pyxis's flags (None: none shown, or a bare job)."""
    if not container or "mounts" not in container:  # who may not manage the job sees its image alone
        return None
    c = ContainerOptions.from_record(container)
    words = []
    if c.mounts:
        words.append("--container-mounts=" + ",".join(m.pyxis() for m in c.mounts))
    if c.workdir:
        words.append(f"--container-workdir={c.workdir}")
    if c.env:
        words.append("--container-env=" + ",".join(c.env))
    words += [flag for on, flag in ((c.mount_home, "--container-mount-home"), (not c.writable, "--container-readonly"),
                                    (c.entrypoint, "--container-entrypoint"), (c.remap_root, "--container-remap-root"))
              if on]
    return " ".join(words) or "(pyxis's defaults)"
