"""The Grafana dashboard in the repo reads only metrics `/metrics` exports (no drift)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.api.test_metrics import FAMILIES

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "trainyard.json"
SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def test_every_query_names_an_exported_family():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["panels"]
    used = set()
    for panel in dash["panels"]:
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            used |= set(re.findall(r"trainyard_[a-z_]+", t["expr"]))
    for name in used:
        base = next((name[: -len(s)] for s in SUFFIXES if name.endswith(s) and name[: -len(s)] in FAMILIES), name)
        assert base in FAMILIES, f"{name} is not exported by /metrics"
    assert {n for n in FAMILIES if not any(u.startswith(n) for u in used)} == set()  # every family on a panel
