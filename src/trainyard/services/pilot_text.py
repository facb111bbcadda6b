"""The pilot's edits of the stored configuration text: a trial put in, taken out, or promoted.

As `config_edit.py` does for a team's quotas, each edit changes only its keys (`yaml_edit.edited`:
comments, order and quoting kept where ruamel's round trip can follow the layout). Taking out a trial that was put in this way gives back the
text it was put into.
"""

from __future__ import annotations

from typing import Any

from trainyard.services import yaml_edit


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
    return yaml_edit.edited(text, change)


def without_trial(text: str) -> str:
    """`text` with `pilot.trial` taken out."""
    def change(doc: Any) -> None:
        doc["pilot"].pop("trial", None)
    return yaml_edit.edited(text, change)


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
    return yaml_edit.edited(text, change)
