"""An edit of the stored configuration text that keeps what a person wrote: comments, key order
and quoting, through ruamel.yaml's round trip (a team's quotas: `config_edit.py`; the pilot's
trial: `pilot_text.py`).

The change is made twice: on PyYAML's plain data (what the result must load as) and on ruamel's
commented data (the text). The round trip is tried with the two common indentations of a block
sequence, keeping the one that changes fewest lines, and is kept only if it loads as exactly the
intended data; a layout the round trip cannot follow is dumped afresh instead, which keeps the
data but not the comments.
"""

from __future__ import annotations

import difflib
import io
from typing import Any, Callable

import yaml

# ruamel writes every block sequence with one indentation; these are the two common ones
# (`teams:\n- name:` and `teams:\n  - name:`), and the one that changes fewest lines is kept.
INDENTS = ((2, 2, 0), (2, 4, 2))


def edited(text: str, change: Callable[[Any], None]) -> str:
    """`text` with `change` made; `change` gets a loaded document (plain or ruamel's: both are
    dicts and lists to it) and edits it in place. An error `change` raises on the plain data (a
    name not found) is raised before any round trip."""
    want = yaml.safe_load(text)
    change(want)
    try:
        out: str | None = min((_round_trip(text, change, indent) for indent in INDENTS),
                              key=lambda o: _changed_lines(text, o))
    except Exception:  # noqa: BLE001 - any layout ruamel cannot follow: fall back to a fresh dump
        out = None
    if out is not None and yaml.safe_load(out) == want:
        return out
    dumped: str = yaml.safe_dump(want, sort_keys=False)  # yaml is untyped: a str when no stream is given
    return dumped


def _round_trip(text: str, change: Callable[[Any], None], indent: tuple[int, int, int]) -> str:
    from ruamel.yaml import YAML  # the plane's dependency only: the CLI never edits configurations

    rt = YAML(typ="rt")
    rt.preserve_quotes = True
    rt.width = 1 << 16  # never reflow a long line
    mapping, sequence, offset = indent
    rt.indent(mapping=mapping, sequence=sequence, offset=offset)
    doc = rt.load(text)
    change(doc)
    out = io.StringIO()
    rt.dump(doc, out)
    return out.getvalue()


def _changed_lines(a: str, b: str) -> int:
    return sum(1 for line in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---")))
