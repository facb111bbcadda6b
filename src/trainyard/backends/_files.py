"""Run-state files both backends keep in a job's run dir (`attempt.json`, the runners' records):
written atomically, so a reader sees the old state or the whole new one, never half a file."""

from __future__ import annotations

import json
import os
from pathlib import Path


def read_json(path: Path) -> dict | None:
    """The file's object, or None when it is missing or not one of ours (atomic writes are whole)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, OSError):
        return None


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
