"""Tests of the scripts in bench/."""

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_module(name: str) -> ModuleType:
    """Import `bench/<name>.py` as its script imports its neighbours (bench/ on the path while it loads)."""
    sys.path[:0] = [str(BENCH)]
    try:
        return importlib.import_module(name)
    finally:
        del sys.path[0]
