"""The pilot's edits of the stored configuration text: a trial put in, taken out, or promoted.

As `config_edit.py` does for a team's quotas, each edit changes only its keys, through
ruamel.yaml's round trip (comments, order and quoting kept), and the result is checked to load as
exactly the intended data; a layout the round trip cannot follow is dumped afresh instead, which
keeps the data but not the comments. Taking out a trial that was put in this way gives back the
text it was put into.
"""

from __future__ import annotations

import difflib
import io
from typing import Any, Callable

import yaml

from trainyard.services.config_edit import INDENTS  # the two common indentations of a sequence


def _edited(text: str, change: Callable[[Any], None]) -> str:
    want = yaml.safe_load(text)
    change(want)
    try:
        edited: str | None = min((_round_trip(text, change, indent) for indent in INDENTS),
                                 key=lambda out: _changed_lines(text, out))
    except Exception:  # noqa: BLE001 - any layout ruamel cannot follow: fall back to a fresh dump
        edited = None
    if edited is not None and yaml.safe_load(edited) == want:
        return edited
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


def _block(mapping: Any) -> None:
    """A flow mapping (`pilot: {nodes: ...}`) written as a block once it holds a trial."""
    fa = getattr(mapping, "fa", None)
    if fa is not None:
        fa.set_block_style()


def with_trial(text: str, entry: dict[str, Any]) -> str:
    """`text` with `pilot.trial` set to `entry` (the caller checked there is a `pilot:` mapping)."""
    def change(doc: Any) -> None:
        _block(doc["pilot"])
        doc["pilot"]["trial"] = entry
    return _edited(text, change)


def without_trial(text: str) -> str:
    """`text` with `pilot.trial` taken out."""
    def change(doc: Any) -> None:
        doc["pilot"].pop("trial", None)
    return _edited(text, change)


def _names(entry: Any) -> list[str]:
    """A `cluster.nodes` entry's node names, as `ClusterSpec.expand` names them."""
    count = int(entry.get("count", 1))
    return [str(entry["name"])] if count == 1 else [f"{entry['name']}-{i}" for i in range(count)]


def promoted(text: str) -> str:
    """`text` with the trial's values in force everywhere and the trial taken out: its `health:`
    section as the configuration's, its features on every node whose entry it names (every node
    of an entry had the same proposed features: they came from one entry of the proposed file)."""
    def change(doc: Any) -> None:
        trial = doc["pilot"].pop("trial")
        if "health" in trial:
            doc["health"] = trial["health"]
        feats = trial.get("features") or {}
        for entry in doc["cluster"]["nodes"]:
            name = next((n for n in _names(entry) if n in feats), None)
            if name is None:
                continue
            if feats[name]:
                entry["features"] = list(feats[name])
            else:
                entry.pop("features", None)
    return _edited(text, change)
