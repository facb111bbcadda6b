"""`--dataset NAME[:VERSION][,NAME[:VERSION]…]` (repeatable), as `yard submit`, `yard alloc`,
`yard srun --pty`, `yard notebook` and `#SBATCH --dataset=` take it: the job's datasets of the
catalogue (`yard dataset ls`), each found by the job at `$TRAINYARD_DATASET_<NAME>` on every node.
No version: the newest the job's team may use, pinned at submission (services/datasets.py).

Checked here first (exit 2 naming the option), so a typo never reaches the plane; whether the
dataset exists and the team may use it is the plane's answer (a 4xx naming `datasets.<i>`).
"""

from __future__ import annotations

import re

from trainyard.staging.types import NAME_RE, VERSION_RE

_ASK = re.compile(rf"^{NAME_RE.pattern[1:-1]}(:{VERSION_RE.pattern[1:-1]})?$")


def parse(raw: str, option: str = "--dataset") -> list[str]:
    """The datasets one `--dataset` value names, in order.

    Raises:
        ValueError: an empty part or one that is not NAME[:VERSION] (the message names `option`).
    """
    out = []
    for part in raw.split(","):
        p = part.strip()
        if not _ASK.match(p):
            raise ValueError(f"{option}: {p!r} is not NAME[:VERSION] (a name [a-z][a-z0-9_-]*, a version of letters, "
                             "digits and ._-; several joined by ',')")
        out.append(p)
    return out


def parse_all(values: list[str], option: str = "--dataset") -> list[str]:
    """Every repeated `--dataset` value's datasets, in order."""
    return [d for raw in values for d in parse(raw, option)]
