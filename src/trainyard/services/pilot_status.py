"""`yard cluster pilot status`: the trial in progress and its effect, the pilot against the rest.

Since the trial began, for the pilot's nodes and for the other nodes side by side:

- attempts ended, and the share of them that failed (FAILED, NODE_FAIL, OUT_OF_MEMORY: what a
  health check or a node's features can cause; a time limit or a cancel is the job's). An attempt
  counts on the pilot's side when any of its ranks ran on a pilot node: its fate was in the
  pilot's hands;
- node events: downs (`node.down`: a check went CRITICAL, the backend lost it), suspects
  (`node.suspect`: a WARN), remediation rounds (`node.remediating`), per side and per node;
- goodput: the compute share of the GPU-seconds allocated on the side's nodes in the period
  (the goodput ledger, services/goodput_report.py, a node's part of an attempt in proportion to
  the GPUs it held there).

Figures per side are totals; the number of nodes on each side is given, for reading them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.services import goodput, goodput_report
from trainyard.services.accounting import Window
from trainyard.services.config import ConfigVersion
from trainyard.spec import pilot
from trainyard.states import AttemptOutcome
from trainyard.store.models import AttemptRow, EventRow

FAILED = (AttemptOutcome.FAILED, AttemptOutcome.NODE_FAIL, AttemptOutcome.OUT_OF_MEMORY)
NODE_EVENTS = {"node.down": "downs", "node.suspect": "suspects", "node.remediating": "remediations"}
SIDES = ("pilot", "rest")


def _empty(nodes: list[str]) -> dict[str, Any]:
    return {"nodes": nodes, "attempts_ended": 0, "attempts_failed": 0, "failure_rate": None,
            **{v: 0 for v in NODE_EVENTS.values()}, "events_by_node": {},
            "allocated_gpu_s": 0.0, "compute_gpu_s": 0.0, "goodput": None}


def status(s: Session, cfg: ConfigVersion, now: float, data_dir: Path | None = None) -> dict[str, Any]:
    """The pilot, its trial (None when none is in progress) and, with a trial, both sides' figures
    since it began (the module docstring)."""
    spec = cfg.spec
    if spec.pilot is None:
        return {"version": cfg.version, "pilot": None, "trial": None, "sides": None}
    names = [n.name for n in cfg.nodes]
    in_pilot = set(spec.pilot.nodes)
    t = pilot.trial(spec)
    out: dict[str, Any] = {"version": cfg.version, "pilot": {"nodes": spec.pilot.nodes}, "trial": None, "sides": None}
    if t is None:
        return out
    out["trial"] = {"since": t.since, "base_version": t.base_version, "message": t.message,
                    "changes": pilot.what_changes(spec, t)}
    sides = {"pilot": _empty([n for n in names if n in in_pilot]), "rest": _empty([n for n in names if n not in in_pilot])}

    def side(node: str) -> dict[str, Any]:
        return sides["pilot" if node in in_pilot else "rest"]

    for placement, state in s.execute(select(AttemptRow.placement, AttemptRow.state)
                                      .where(AttemptRow.ended_at.is_not(None), AttemptRow.ended_at >= t.since)):
        nodes = {str(p.get("node")) for p in placement or [] if isinstance(p, dict)}
        d = sides["pilot" if nodes & in_pilot else "rest"]
        d["attempts_ended"] += 1
        d["attempts_failed"] += state in FAILED
    for kind, node in s.execute(select(EventRow.kind, EventRow.node).where(
            EventRow.time >= t.since, EventRow.kind.in_(NODE_EVENTS), EventRow.node.is_not(None))):
        d = side(str(node))
        d[NODE_EVENTS[kind]] += 1
        per = d["events_by_node"].setdefault(node, {v: 0 for v in NODE_EVENTS.values()})
        per[NODE_EVENTS[kind]] += 1
    buckets = {k: goodput.empty() for k in SIDES}
    for piece in goodput_report.pieces(s, Window(t.since, now), now, data_dir=data_dir, spec=spec):
        for node, share in goodput_report.node_shares(piece):
            b = buckets["pilot" if node in in_pilot else "rest"]
            for k, v in piece.buckets.items():
                b[k] += v * share
    for k in SIDES:
        d = sides[k]
        d["failure_rate"] = d["attempts_failed"] / d["attempts_ended"] if d["attempts_ended"] else None
        d["allocated_gpu_s"] = math.fsum(buckets[k].values())
        d["compute_gpu_s"] = buckets[k].get("compute", 0.0)
        d["goodput"] = goodput.share(buckets[k])
    out["sides"] = sides
    return out
