"""Where things are by default; light on purpose, as every CLI command imports it."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PORT = 8642


def default_data_dir() -> Path:
    """`$YARD_DATA_DIR`, else `~/.trainyard`: the store, tokens, job dirs and `server.json`."""
    return Path(os.environ.get("YARD_DATA_DIR") or Path.home() / ".trainyard")
