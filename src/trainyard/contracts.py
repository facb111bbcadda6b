"""The contracts between the parts (DESIGN.md), as constants both sides import.

- Exit code 75: "I checkpointed; requeue me" (the answer to a preemption notice).
- Preemption notice: SIGUSR1 to every rank; SIGTERM after the class's grace period; then SIGKILL.
- Checkpoints: `<TRAINYARD_CHECKPOINT_DIR>/step-<N>/` counts once `step-<N>/COMMITTED` exists;
  the newest committed step is the one to resume from.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

REQUEUE_EXIT = 75
NOTICE_SIGNAL = signal.SIGUSR1
CHECKPOINT_MARKER = "COMMITTED"
_STEP = re.compile(r"step-(\d+)$")


def committed_steps(checkpoint_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every committed checkpoint, oldest first."""
    out = []
    try:
        entries = list(os.scandir(checkpoint_dir))
    except OSError:
        return []
    for e in entries:
        m = _STEP.match(e.name)
        if m and e.is_dir() and os.path.exists(os.path.join(e.path, CHECKPOINT_MARKER)):
            out.append((int(m.group(1)), Path(e.path)))
    return sorted(out)


def newest_checkpoint(checkpoint_dir: str | Path) -> tuple[int, Path, float] | None:
    """(step, directory, commit time) of the newest committed checkpoint, or None."""
    steps = committed_steps(checkpoint_dir)
    if not steps:
        return None
    step, path = steps[-1]
    return step, path, os.path.getmtime(path / CHECKPOINT_MARKER)
