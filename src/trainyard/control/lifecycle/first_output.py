"""Has an attempt printed anything yet? The end of a bare job's startup (issue 39: the ledger's
`startup` bucket runs from allocation to the first line of output or the first step), set by the
telemetry sampler as `attempts.first_output_at` (control/lifecycle/telemetry.py).

The rank logs are the owner's files (design rule 7): each is looked at through `jobfs` only — its
entry, never a link followed (a symlink to a big file placed as the log is no output), never a
FIFO or device opened, at most `TAIL` bytes read. A log is appended across attempts and each
attempt's ranks begin with the backend's marker line (`=== trainyard: attempt N started …`), so a
log holds output of attempt N when something follows N's marker in its tail; when no marker of N
is in the tail (the output pushed it out, or the backend writes none), when the file was written
since the attempt started.
"""

from __future__ import annotations

import stat
from pathlib import Path

from trainyard import jobfs
from trainyard.contracts import JobDir

TAIL = 4096  # bytes: the marker line and some output past it


def printed(job_dir: JobDir, ranks: int, attempt: int, started_at: float) -> bool:
    """Whether any of the attempt's first `ranks` rank logs (and their apart stderr) holds output."""
    tree = jobfs.Tree(job_dir.root)
    marker = f"=== trainyard: attempt {attempt} started ".encode()
    for r in range(ranks):
        for path in (job_dir.rank_log(r), job_dir.rank_err(r)):
            if _has_output(tree, path.relative_to(job_dir.root), marker, started_at):
                return True
    return False


def _has_output(tree: jobfs.Tree, rel: Path, marker: bytes, started_at: float) -> bool:
    st = tree.lstat(rel)
    if st is None or not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return False  # missing, a link, a FIFO, a directory: no output of the job's
    try:
        tail = tree.read_tail(rel, TAIL)
    except OSError:
        return False  # refused (a second name, a link swapped in meanwhile) or gone
    at = tail.rfind(marker)
    if at < 0:
        return st.st_mtime >= started_at
    end = tail.find(b"\n", at)
    return end >= 0 and len(tail) > end + 1
