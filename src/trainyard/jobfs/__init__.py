"""The one way the control plane touches files a job's owner can change (design rule 7).

Why: the plane often runs as root, and a job's owner controls much of what lies under the job's
directory (checkpoints/, metrics/, a Slurm attempt's run dir) and all of its working directory. A
hostile member can put a link, a FIFO, a device or a gigabyte where the plane reads or writes, and
swap a directory for a link between two steps of a launch. Every such read, write, listing, mkdir,
chown and link of the plane goes through this package, and `tests/test_architecture.py` fails when
`control/`, `services/`, `api/` or the plane's side of `backends/` does it another way.

Two ways in, after what the path is:

- **Under a root the plane owns** (`Tree`): its data dir, a job's directory (plane-owned, 0750,
  inside the plane's `jobs/`). The way from the root is walked one component at a time with
  `O_NOFOLLOW|O_DIRECTORY` descriptors, so no link anywhere below the root is followed, whatever
  is swapped between two calls (the `openat2(RESOLVE_NO_SYMLINKS|RESOLVE_BENEATH)` guarantee,
  built from calls every kernel has). A file is opened `O_NOFOLLOW|O_NONBLOCK` (a FIFO opens at once
  instead of waiting for a writer) and used only when `fstat` says it is a regular file; one read
  has a file with a second name refused too (a hard link may be anyone's file). Every read is
  bounded: a page (`read_range`), the end (`read_tail`), a small record (`read_json`), or windows
  spread over a big file (`sample_lines`): the plane's memory never grows with what a job writes.
- **Where the owner chooses** (`as_owner`: the working directory, `--output` paths): done in a
  short-lived child that has dropped to the owner's groups, gid and uid, so the kernel checks every
  step as it would for the owner, as Slurm's slurmstepd opens a job's output as the user. The child
  is killed after a timeout, so a hung file system or a FIFO never holds the plane.

Errors are `OSError`s: `Refused` (a link, not a regular file or directory, a path that leaves its
root) or what the kernel said. Standard library only: the backends use it too.

    tree.py      `Tree` (walks, bounded reads, atomic writes, removals), `Refused`, `Chunk`
    usage.py     `UsageWalk`: `du -sx` in slices (the storage meter)
    records.py   the plane's own directories, run records, checkpoint markers
    owner.py     `as_owner` and what it runs in the working directory (`link_inside`, ...)
"""

from __future__ import annotations

from trainyard.jobfs.owner import (OWNER_TIMEOUT_S, Account, as_owner, cannot_enter, enter_problem, link_at,
                                   link_inside, lstat_way, place_problem, plane_acts_for)
from trainyard.jobfs.records import (commit_time, committed_steps, newest_checkpoint, plane_dir, plane_uid, read_record,
                                     record_exists, touch_record, write_record)
from trainyard.jobfs.tree import JSON_MAX, PAGE_MAX, TAIL_DEFAULT, Chunk, Refused, Tree
from trainyard.jobfs.usage import UsageWalk

__all__ = ["JSON_MAX", "OWNER_TIMEOUT_S", "PAGE_MAX", "TAIL_DEFAULT", "Account", "Chunk", "Refused", "Tree",
           "UsageWalk", "as_owner", "cannot_enter", "commit_time", "committed_steps", "enter_problem", "link_at",
           "link_inside", "lstat_way", "newest_checkpoint", "place_problem", "plane_acts_for", "plane_dir",
           "plane_uid", "read_record", "record_exists", "touch_record", "write_record"]
