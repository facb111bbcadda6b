"""sbatch's `--signal=[{R|B}:]SIG[@secs]`: a notice sent `secs` before the job's time limit.

A job that knows its end is near checkpoints instead of losing its work at the kill: the plane
sends SIG once per attempt when `secs` (default 60, as Slurm; at most 65535) are left of its time
limit (its own `--time` or its class's max run time, the nearer), then stops it at the limit as
before (control/loop/stops.py). Used by the CLI (validation that names the option) and the server
(the stored, normalised form).

`B:` (Slurm: the batch shell only) and no prefix (Slurm: the tasks only) are kept in the stored
form; the local backend's one `signal` method reaches the processes of the attempt that handle the
signal, the script's shell and its tasks alike (backends/local/backend.py), so a trap in either sees it.
`R:` (Slurm's reservation-end notice) is refused: trainyard's admin reservations send no notice at their end.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

DEFAULT_SECS = 60
MAX_SECS = 65535
_FORM = re.compile(r"(?:([A-Za-z]+):)?([A-Za-z0-9]+)(?:@(\d+))?")
# Signals a job may ask for: not SIGKILL/SIGSTOP (no job can handle them), nothing out of range.
_ALLOWED = {s for s in signal.Signals if s not in (signal.SIGKILL, signal.SIGSTOP)}


@dataclass(frozen=True)
class SignalSpec:
    sig: signal.Signals
    secs: int = DEFAULT_SECS
    batch_only: bool = False

    def text(self) -> str:
        """The normalised form that is stored: `[B:]NAME@secs` (NAME without its SIG prefix)."""
        return f"{'B:' if self.batch_only else ''}{self.sig.name[3:]}@{self.secs}"


def parse_signal(raw: str, option: str = "--signal") -> SignalSpec:
    """`raw` in sbatch's form: USR1, SIGUSR1, 10, B:USR1@30, TERM@120.

    Raises:
        ValueError: not that form, an unknown or unusable signal, R:, or secs over 65535
            (the message names `option`).
    """
    m = _FORM.fullmatch(raw.strip())
    if not m:
        raise ValueError(f"{option}: expected [B:]SIG[@secs] (e.g. USR1@60 or B:USR1@30), got {raw!r}")
    prefix, name, secs = m.group(1), m.group(2), m.group(3)
    if prefix is not None and prefix.upper() != "B":
        why = "trainyard's reservations send no notice at their end" if prefix.upper() == "R" else "only B: is known"
        raise ValueError(f"{option}: prefix {prefix}: is not supported ({why}); got {raw!r}")
    try:
        sig = signal.Signals(int(name)) if name.isdigit() else signal.Signals[
            name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()]
    except (KeyError, ValueError):
        raise ValueError(f"{option}: unknown signal {name!r}; got {raw!r}") from None
    if sig not in _ALLOWED:
        raise ValueError(f"{option}: {sig.name} cannot be handled by a job, so it is no notice; got {raw!r}")
    n = DEFAULT_SECS if secs is None else int(secs)
    if n > MAX_SECS:
        raise ValueError(f"{option}: at most {MAX_SECS} seconds before the limit, got {raw!r}")
    return SignalSpec(sig, n, prefix is not None)
