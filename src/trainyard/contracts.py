"""The contracts between the parts (DESIGN.md), as constants both sides import.

- Exit code 75: "I checkpointed; requeue me" (the answer to a preemption notice).
- Preemption notice: SIGUSR1 to every rank; SIGTERM after the class's grace period; then SIGKILL.
- Checkpoints: `<TRAINYARD_CHECKPOINT_DIR>/step-<N>/` counts once `step-<N>/COMMITTED` exists;
  the newest committed step is the one to resume from.
- Exit code 86: the job's watchdog saw no training step within its timeout (hung, not crashed).
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


# -- additions for the in-job runtime (trainyard.runtime) ------------------------------------------

# Exit code of a job whose watchdog fired: no training step completed within the configured time
# (a hung rank, a frozen GPU, a deadlocked collective). Distinct from 75 (requeue me), from 1 (a
# Python exception) and from 128+N (killed by signal N), so the control plane can classify the
# attempt as hung rather than crashed. 86 has no conventional meaning elsewhere (Python uses 1 and
# 2, shells 126 and 127, signals 128+N).
WATCHDOG_EXIT = 86

# The signals the runtime treats as "checkpoint at the next step boundary, then exit 75": the
# notice, and the SIGTERM that follows it after the grace period (some launchers only send SIGTERM).
PREEMPT_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
