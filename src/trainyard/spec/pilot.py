"""The pilot pool: a change of health checks, remediation or node features tried on a few nodes
first (issue 40; docs/control-plane.md, "Pilot pool").

The configuration names the pilot's nodes (`pilot: {nodes: "node-[0-1]"}`). A trial in progress is
itself part of the configuration (`pilot.trial`, `spec.models.TrialSpec`), so that starting it,
promoting it and rolling it back are each a configuration version, listed, diffed and audited like
any other, and a plane restarted in the middle of a trial runs the same trial.

`effective_for(spec, node)` is the one answer to "which settings does this node run under": the
trial's on a pilot node, the configuration's own elsewhere. The health checker, the node watch,
the before-work gate and remediation ask it for a node's `health`, and the nodes the scheduler and
the submit checks see (`effective_nodes`) carry its `features`.

What the file given to `--pilot` may change (`trial_of`) is `PILOTABLE`: the `health:` section and
the nodes' `features`. Anything else differing is refused, naming the section: a change of quotas
or classes has no meaning on a subset of the nodes. The default image is not pilotable: a job's
image is chosen when it is submitted, before it has a node.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from trainyard.sched.cluster import Node
from trainyard.spec.models import ConfigSpec, HealthSpec, TrialSpec

PILOTABLE = ("health", "cluster.nodes[].features")


@dataclass(frozen=True)
class NodeSettings:
    """What one node runs under: its health checks and remediation, its features."""

    pilot: bool  # the node is in the pilot pool and a trial is in progress
    health: HealthSpec
    features: frozenset[str] | None  # None: the node's own, as configured


def effective_for(spec: ConfigSpec, node: str) -> NodeSettings:
    """The settings `node` runs under: the trial's on a pilot node while a trial is in progress,
    the configuration's own otherwise (the module docstring)."""
    p = spec.pilot
    trial = p.trial if p is not None and node in p.nodes else None
    if trial is None:
        return NodeSettings(False, spec.health, None)
    feats = trial.features.get(node)
    return NodeSettings(True, trial.health if trial.health is not None else spec.health,
                        None if feats is None else frozenset(feats))


def effective_nodes(spec: ConfigSpec) -> list[Node]:
    """The engine's nodes (`ClusterSpec.expand`), a pilot node with the trial's features."""
    out = []
    for n in spec.cluster.expand():
        feats = effective_for(spec, n.name).features
        out.append(n if feats is None else dataclasses.replace(n, features=feats))
    return out


def trial(spec: ConfigSpec) -> TrialSpec | None:
    return spec.pilot.trial if spec.pilot is not None else None


def _comparable(spec: ConfigSpec) -> dict[str, Any]:
    """The configuration as data, less what a trial may change (and the trial itself)."""
    d = spec.model_dump(mode="json")
    d.pop("health", None)
    for n in d["cluster"]["nodes"]:
        n.pop("features", None)
    if d.get("pilot"):
        d["pilot"].pop("trial", None)
    return d


def outside_pilotable(base: ConfigSpec, proposed: ConfigSpec) -> list[str]:
    """The sections (top-level keys, `cluster.nodes` for a node's other fields) in which `proposed`
    differs from `base` outside what a trial may change."""
    a, b = _comparable(base), _comparable(proposed)
    out = []
    for key in sorted(set(a) | set(b)):
        if key == "cluster" and a.get(key) != b.get(key):
            ca, cb = a["cluster"], b["cluster"]
            out += [f"cluster.{k}" for k in sorted(set(ca) | set(cb)) if ca.get(k) != cb.get(k)]
        elif a.get(key) != b.get(key):
            out.append(key)
    return out


def features_by_node(spec: ConfigSpec) -> dict[str, list[str]]:
    """Every node's own features, by name (`count` expanded)."""
    return {n.name: sorted(n.features) for n in spec.cluster.expand()}


def proposed_features(base: ConfigSpec, proposed: ConfigSpec) -> dict[str, list[str]]:
    """The nodes whose features `proposed` changes, with their proposed features."""
    a, b = features_by_node(base), features_by_node(proposed)
    return {n: b[n] for n in b if a.get(n) != b[n]}


def what_changes(base: ConfigSpec, t: TrialSpec) -> list[str]:
    """The trial in a few lines, for people: checks added, removed or changed, remediation and the
    other health settings, features by node."""
    out: list[str] = []
    if t.health is not None:
        old = {c.name: c for c in base.health.checks}
        new = {c.name: c for c in t.health.checks}
        out += [f"check {n} added ({new[n].kind})" for n in new if n not in old]
        out += [f"check {n} removed" for n in old if n not in new]
        out += [f"check {n} changed" for n in new if n in old and new[n] != old[n]]
        if t.health.remediation != base.health.remediation:
            out.append("remediation changed")
        for k in ("interval", "before_work_max_age"):
            if getattr(t.health, k) != getattr(base.health, k):
                out.append(f"health.{k}: {getattr(base.health, k):g} -> {getattr(t.health, k):g}")
    own = features_by_node(base)
    out += [f"node {n}: features {own.get(n, [])} -> {f}" for n, f in sorted(t.features.items())]
    return out


class Refused(ValueError):
    """Why there can be no trial of a file: `field` the section to blame; `state`: the
    configuration's state is the cause (no pilot, a trial in progress), not the file."""

    def __init__(self, message: str, field: str, state: bool = False) -> None:
        super().__init__(message)
        self.message, self.field, self.state = message, field, state


def trial_of(base: ConfigSpec, proposed: ConfigSpec) -> tuple[HealthSpec | None, dict[str, list[str]]]:
    """What a trial of `proposed` on `base`'s pilot holds: its health section (None when
    unchanged) and the features it changes.

    Raises:
        Refused: `base` has no pilot or a trial already; `proposed` holds a trial, differs outside
            `PILOTABLE` (the field names the first section) or changes nothing pilotable.
    """
    if base.pilot is None:
        raise Refused("the configuration in force has no pilot pool: name its nodes first (pilot: {nodes: ...}) "
                      "with yard cluster apply", "pilot", state=True)
    if base.pilot.trial is not None:
        raise Refused(f"a trial is in progress on the pilot since version {base.pilot.trial.base_version}: "
                      "promote it or roll it back first (yard cluster pilot status)", "pilot.trial", state=True)
    if proposed.pilot is not None and proposed.pilot.trial is not None:
        raise Refused("pilot.trial: the file holds a trial; give the configuration without it", "pilot.trial")
    differs = outside_pilotable(base, proposed)
    if differs:
        raise Refused(f"{', '.join(differs)}: differs from the configuration in force; a pilot takes changes to "
                      f"{' and '.join(PILOTABLE)} only (apply the rest without --pilot)", differs[0])
    health = proposed.health if proposed.health != base.health else None
    feats = proposed_features(base, proposed)
    if health is None and not feats:
        raise Refused("the file changes nothing a pilot can try (health, node features)", "health")
    return health, feats
