"""Where a submission may run, checked against the configuration before anything is stored.

sbatch's placement options (issue 17 item 3) reach the engine as one `sched.constraints.Where`;
here they are validated against the nodes of the pool, so that a job that asked for something no
node has is a 400 naming the option at submission, never a job that waits for ever:

- `gpu_model` (`--gpus=TYPE:N`, `--gres=gpu:TYPE:N`): some node of the pool has that model;
- `constraint` (`-C`): it parses (`parse_features`), every feature it names is some node's;
- both matched regardless of case (`a100` is a node's `A100`) and stored as the configuration
  spells them, so the engine compares them exactly;
- `nodelist` / `exclude` (`-w` / `-x`, Slurm hostlists such as `node-[0-1]`): every name is a
  node of the pool; a job must not include more nodes than it asks for;
- and together: enough nodes (and GPUs) allow the job for its size.

`-n/--ntasks` (`apply_ntasks`) becomes the shape sbatch would give: with `-N M`, N/M tasks per
node (uneven layouts refused); without `-N`, one node with N tasks, or, when `--gpus` equals N,
one task per GPU wherever the GPUs are; with no GPUs asked, one GPU per task (trainyard's jobs
always hold GPUs, and a task per GPU is its default).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from trainyard.contracts import expand_hostlist
from trainyard.spec.parsing import parse_node_range
from trainyard.sched.cluster import Node
from trainyard.sched.constraints import ConstraintError, feature_names, parse_features, where_of
from trainyard.services.errors import ServiceError


def hostlist(value: str | Sequence[str] | None, option: str) -> list[str]:
    """Node names from a hostlist text (`n[0-1],m2`) or a list of them."""
    if value is None:
        return []
    texts = [value] if isinstance(value, str) else list(value)
    out: list[str] = []
    for t in texts:
        try:
            names = expand_hostlist(t.strip())
        except ValueError as e:
            raise ServiceError(f"{option}: {e}", field=option) from None
        out += [n for n in names if n not in out]
    if not out:
        raise ServiceError(f"{option}: no node names in {value!r}", field=option)
    return out


def apply_ntasks(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` (a submission's) with `ntasks` turned into nodes / tasks_per_node / GPUs."""
    n = fields.get("ntasks")
    if n is None:
        return fields
    out = dict(fields)
    tpn, nodes = fields.get("tasks_per_node"), fields.get("nodes")
    if nodes is not None:
        lo, hi = parse_node_range(nodes)
        if lo != hi:
            raise ServiceError(f"-n/--ntasks: {n} tasks over a range of nodes ({nodes}) has no fixed layout; "
                               "give -N a single count", field="ntasks")
        if tpn is not None and tpn * lo != n:
            raise ServiceError(f"-n/--ntasks={n} conflicts with --ntasks-per-node={tpn} on {lo} node(s) "
                               f"({tpn * lo} tasks)", field="ntasks")
        if n % lo:
            raise ServiceError(f"-n/--ntasks: {n} tasks do not divide evenly over {lo} nodes; trainyard runs the "
                               "same number of tasks on every node", field="ntasks")
        out["tasks_per_node"] = n // lo
        return out
    if tpn is not None and tpn != n:
        raise ServiceError(f"-n/--ntasks={n} conflicts with --ntasks-per-node={tpn} on one node", field="ntasks")
    gpus, gpn = fields.get("gpus"), fields.get("gpus_per_node")
    if gpn is None and gpus == n:
        return out  # one task per GPU, wherever the GPUs are
    out["nodes"], out["tasks_per_node"] = 1, n
    if gpus is None and gpn is None:
        out["gpus_per_node"] = n
    return out


def check(values: dict[str, Any], pool: str, nodes: Sequence[Node], shape: tuple[int, int, int | None, int]) -> dict[str, Any]:
    """The job's placement columns (constraint, gpu_model, nodelist, exclude_nodes, exclusive),
    checked against `nodes` (the configuration's). Raises ServiceError naming the option."""
    model, text = values.get("gpu_model"), values.get("constraint")
    include = hostlist(values.get("nodelist"), "--nodelist")
    exclude = hostlist(values.get("exclude"), "--exclude")
    exclusive = bool(values.get("exclusive"))
    lo, hi, gpn, total = shape
    in_pool = [n for n in nodes if n.pool == pool]
    if model is not None:
        models = sorted({n.gpu_model for n in in_pool})
        model = _spelled(model, models)
        if model not in models:
            raise ServiceError(f"--gpus/--gres: no node of pool {pool!r} has GPU model {model!r}; models are {models}",
                               field="gpu_model")
    if text is not None:
        known = sorted({f for n in in_pool for f in n.features})
        try:
            expr = parse_features(text)
            text = _features_spelled(text, expr, known)
            expr = parse_features(text)
        except ConstraintError as e:
            raise ServiceError(f"-C/--constraint: {e}", field="constraint") from None
        unknown = [f for f in feature_names(expr) if f not in known]
        if unknown:
            raise ServiceError(f"-C/--constraint: no node of pool {pool!r} has feature {unknown[0]!r}; "
                               f"features are {known}", field="constraint")
    names = {n.name for n in in_pool}
    for option, given in (("--nodelist", include), ("--exclude", exclude)):
        missing = [x for x in given if x not in names]
        if missing:
            raise ServiceError(f"{option}: no node {missing[0]!r} in pool {pool!r} (see yard nodes)", field=option)
    if set(include) & set(exclude):
        raise ServiceError(f"--nodelist and --exclude both name {sorted(set(include) & set(exclude))[0]!r}",
                           field="--exclude")
    if len(include) > hi and gpn is not None:
        raise ServiceError(f"--nodelist: {len(include)} nodes named, but the job asks for {hi}", field="--nodelist")
    if exclusive and values.get("gpu_mem_gb") is not None:
        raise ServiceError("--exclusive: an exclusive job holds whole nodes; --gpu-mem shares GPUs", field="exclusive")
    where = where_of(text, model, include, exclude, exclusive)
    if where is not None:
        ok = [n for n in in_pool if where.allows(n)]
        bad = [x for x in include if x not in {n.name for n in ok}]
        if bad:
            raise ServiceError(f"--nodelist: node {bad[0]!r} does not have what the job asks for "
                               "(GPU model, -C features)", field="--nodelist")
        fit = [n for n in ok if gpn is None or n.gpus >= gpn]
        if len(fit) < lo or sum(n.gpus for n in fit) < total:
            raise ServiceError(f"{_options(values)}: only {len(fit)} node(s) of pool {pool!r} "
                               f"({sum(n.gpus for n in fit)} GPUs) allow this job, which needs {lo} node(s), "
                               f"{total} GPUs", field="constraint")
    return {"constraint": text, "gpu_model": model, "nodelist": include or None, "exclude_nodes": exclude or None,
            "exclusive": exclusive}


def _spelled(name: str, known: Sequence[str]) -> str:
    """`name` as the configuration spells it when it differs only in case (`a100` for `A100`: GPU
    models and features are written both ways, and the docs' examples are lowercase); a name that
    two configured spellings match, or none, is left as given."""
    if name in known:
        return name
    same = [k for k in known if k.lower() == name.lower()]
    return same[0] if len(same) == 1 else name


def _features_spelled(text: str, expr: Any, known: Sequence[str]) -> str:
    """The `-C` text with each feature name spelled as the configuration does (`_spelled`)."""
    for name in sorted(feature_names(expr), key=len, reverse=True):
        fixed = _spelled(name, known)
        if fixed != name:
            text = re.sub(rf"(?<![A-Za-z0-9_.=:+-]){re.escape(name)}(?![A-Za-z0-9_.=:+-])", fixed, text)
    return text


def _options(values: dict[str, Any]) -> str:
    names = [o for o, k in (("-C/--constraint", "constraint"), ("--gpus model", "gpu_model"),
                            ("--exclude", "exclude"), ("--nodelist", "nodelist")) if values.get(k)]
    return " with ".join(names) or "--exclusive"
