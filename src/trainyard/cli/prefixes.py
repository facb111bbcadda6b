"""Abbreviated long options, as sbatch reads them (`--tim=10` is `--time=10`).

sbatch (getopt_long) takes any prefix of a long option that names it alone. Here a prefix names
an option when it is the prefix of exactly one, or when every option it begins extends the
shortest of them (`--tim` → `--time`, though `--time-min` also begins so; `--mem` stays `--mem`):
the shorter option is the one a person typing it has fully spelled. Any other prefix (`--mem-per`:
`--mem-per-cpu` or `--mem-per-gpu`?) is refused naming the candidates, never guessed. Used for
`#SBATCH` lines (cli/sbatch.py) and `yard submit`'s command line (cli/strict.py).
"""

from __future__ import annotations

from typing import Iterable


class AmbiguousOption(ValueError):
    """A prefix of several options that does not pick one; the message names them."""


def expand(name: str, known: Iterable[str]) -> str | None:
    """The long option `name` (`--xyz`, without a value) stands for among `known`: itself when
    known, else the one it abbreviates; None when it begins none.

    Raises:
        AmbiguousOption: it begins several, none of which the others all extend.
    """
    names = set(known)
    if name in names or not name.startswith("--") or len(name) < 3:
        return name if name in names else None
    cands = sorted(o for o in names if o.startswith(name))
    if not cands:
        return None
    shortest = min(cands, key=len)
    if all(c.startswith(shortest) for c in cands):
        return shortest
    raise AmbiguousOption(f"{name} is ambiguous: it could be {', '.join(cands)}")
