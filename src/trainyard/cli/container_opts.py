"""pyxis's `--container-*` options, as `yard submit` takes them on its command line and in `#SBATCH`
lines (cli/sbatch.py): checked here with the standard-library parsers (`spec.image_ref`,
`spec.container_mounts`), so a bad value is exit 2 naming the option (and the script's line) before
anything is sent; the API checks them again (services/images.py `ContainerSubmit`).

    --container-image=[USER@][REGISTRY#]IMAGE[:TAG|@sha256:…]   (or REGISTRY/IMAGE[:TAG], as Docker writes it)
    --container-mounts=SRC[:DST[:FLAGS]][,…]     --container-workdir=PATH     --container-env=NAME[,NAME…]
    --[no-]container-mount-home   --container-writable | --container-readonly
    --[no-]container-entrypoint   --[no-]container-remap-root

Options other than the image without `--container-image` apply to the team's default image
(`images:` in the cluster configuration); a team without one refuses them at submit.
"""

from __future__ import annotations

from typing import Any

from trainyard.spec import container_flags
from trainyard.spec.container_flags import VALUED
from trainyard.spec.container_mounts import parse_mounts
from trainyard.spec.image_ref import parse_image

OPTION_OF = {key: option for option, key in VALUED.items()}


def value(option: str, raw: str) -> Any:
    """One valued option's value as the API takes it.

    Raises:
        ValueError: the message starts with `option` and says what is wrong.
    """
    if option == "--container-image":
        parse_image(raw, option)
        return raw.strip()
    if option == "--container-mounts":
        return ",".join(m.pyxis() for m in parse_mounts(raw, option))
    if option == "--container-workdir":
        return container_flags.workdir(raw, option)
    if option == "--container-env":
        names = [n.strip() for n in raw.split(",") if n.strip()]
        if not names:
            raise ValueError(f"{option}: expected NAME[,NAME...], the variables whose host value wins; got {raw!r}")
        return container_flags.env_names(names, option)
    raise ValueError(f"{option}: not a container option")


def given(image: str | None, mounts: str | None, workdir: str | None, env: str | None,
          flags: dict[str, bool | None]) -> dict[str, Any]:
    """The command line's container options (None: not given), checked, as `container` keys.

    Raises:
        ValueError: naming the option.
    """
    out: dict[str, Any] = {}
    for option, raw in (("--container-image", image), ("--container-mounts", mounts),
                        ("--container-workdir", workdir), ("--container-env", env)):
        if raw is not None:
            out[VALUED[option]] = value(option, raw)
    out.update({k: v for k, v in flags.items() if v is not None})
    return out


def merged(script: dict[str, Any], command_line: dict[str, Any]) -> dict[str, Any] | None:
    """The job's `container`: a script's `#SBATCH` options, the command line's over them (as sbatch
    lets the command line win); None when neither gave one."""
    out = {**script, **command_line}
    return out or None
