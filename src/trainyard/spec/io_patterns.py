"""Slurm's filename patterns, for `--output` and `-e/--error` (sbatch's "filename pattern").

    %%   a percent sign          %A   the array's job id (outside an array: the job's id)
    %a   the array task index (0 outside an array)    %b   that index modulo 10
    %j   the job id              %J   job id and step: `<id>.batch` for a script, `<id>.0` for a command
    %s   the step: `batch` for a script, `0` for a command (its one step)
    %N   the node's short name (a script's: the first node; a command's rank: its own node)
    %n   the node's index in the allocation (a script: 0)
    %t   the task (rank) id      %u   the user name            %x   the job name

A number between `%` and the letter zero-pads a number (`%5j` → `00042`), as in Slurm; it is
ignored for text (`%5x`). Anything else after `%` is refused, naming the option: a pattern that
meant something else must not make a file of another name quietly.
"""

from __future__ import annotations

import re

LETTERS = "AabjJsNntux"
NUMERIC = frozenset("AabjtnJ")
_TOKEN = re.compile(r"%(\d*)(.?)", re.S)


def check(pattern: str, option: str = "--output") -> str:
    """`pattern` if every `%` in it is one of Slurm's patterns (module docstring).

    Raises:
        ValueError: an unknown letter after `%`, or a `%` at the end (the message names `option`).
    """
    for m in _TOKEN.finditer(pattern):
        letter = m.group(2)
        if letter == "%" and not m.group(1):
            continue
        if not letter or letter not in LETTERS:
            shown = "%" + m.group(1) + letter if letter else "a lone % at the end"
            raise ValueError(f"{option}: unknown filename pattern {shown!r} in {pattern!r}; Slurm's are %%, %A, %a, "
                             "%b, %j, %J, %s, %N, %n, %t, %u, %x (a number after % zero-pads: %5j)")
    return pattern


def expand(pattern: str, values: dict[str, str]) -> str:
    """`pattern` with each `%[N]L` replaced by `values[L]` (zero-padded to N for numbers), `%%` by `%`.
    `values` holds every letter of LETTERS; the pattern was `check`ed."""
    def one(m: re.Match) -> str:
        width, letter = m.group(1), m.group(2)
        if letter == "%" and not width:
            return "%"
        v = values[letter]
        if width and letter in NUMERIC and v.isdigit():
            return v.zfill(int(width))
        return v
    return _TOKEN.sub(one, pattern)


def uses(pattern: str, letters: str) -> bool:
    """Whether `pattern` has a `%[N]L` for one of `letters` (not counting `%%`)."""
    return any(m.group(2) in letters and not (m.group(2) == "%" and not m.group(1))
               for m in _TOKEN.finditer(pattern) if m.group(2))
