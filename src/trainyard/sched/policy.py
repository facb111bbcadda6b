"""The one interface every scheduling policy implements, and the registry of policies by name.

A policy is an object with a `name` and a `cycle(snapshot) -> CycleResult` method. It may hold
configuration (weights, thresholds) but no state between cycles: whatever history it weighs
(attained service, decayed usage, when a job last started) comes in through the snapshot.

Parameters. A policy is built by name from a mapping of plain values, `get_policy(name, params)`,
which is how the cluster configuration's `scheduler:` section (validated in `trainyard.spec.models`) and
`yard sim --config` choose one. What a policy's parameters are is read from its factory, so that
a policy declares them once, in its own code, with their defaults:
- a factory that takes one dataclass argument (`TrainyardPolicy(params: EngineParams)`) has that
  dataclass's fields as its parameters;
- any other factory has its keyword arguments, each with a default, as its parameters
  (`Slurm(w_age=..., w_fairshare=...)`, `Tiresias(thresholds=..., starve_limit=...)`); a factory
  with none (`Fifo()`) takes no parameters;
- a parameter whose type is a dataclass is a nested group (`ordering:` for `OrderingParams`);
- a parameters dataclass may name the flat spellings it still reads in a class attribute `FLAT`
  (old name -> (group, field), `EngineParams.FLAT`): `get_policy` moves them into their groups
  (`nest_flat`), and `flat_aliases(name)` lists them for validators and their deprecation notes.
`policy_params(name)` describes them (names, types, defaults) for validators and docs. Built
without parameters, a policy is exactly its factory's default: `get_policy("trainyard")` is
`TrainyardPolicy()`, whatever this module learns to build.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import inspect
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, TypeVar

from trainyard.sched.types import CycleResult, Snapshot


class Policy(Protocol):
    name: str

    def cycle(self, snap: Snapshot) -> CycleResult: ...


P = TypeVar("P")


def gc_paused(cycle: Callable[[P, Snapshot], CycleResult]) -> Callable[[P, Snapshot], CycleResult]:
    """Run a policy's cycle with Python's cyclic garbage collector paused.

    A cycle allocates tens of thousands of short-lived tuples and small objects and builds no
    reference cycles: all of it is freed by reference counting when the cycle returns. With the
    collector on, those allocations keep triggering collections that rescan the snapshot's
    ~100,000 live objects (jobs, placements, nodes) for garbage that is not there: a third of a
    cycle's time at 13,000 jobs, and not merely deferred (30 cycles back to back took 30% less
    wall time paused than not, the collections after them included). Every policy uses it, so
    comparisons stay fair.
    """

    @functools.wraps(cycle)
    def wrapper(self: P, snap: Snapshot) -> CycleResult:
        if not gc.isenabled():
            return cycle(self, snap)
        gc.disable()
        try:
            return cycle(self, snap)
        finally:
            gc.enable()

    return wrapper


_REGISTRY: dict[str, Callable[..., Policy]] = {}


def register(name: str) -> Callable[[Callable[..., Policy]], Callable[..., Policy]]:
    def deco(factory: Callable[..., Policy]) -> Callable[..., Policy]:
        _REGISTRY[name] = factory
        _describe.cache_clear()
        return factory

    return deco


def policy_names() -> list[str]:
    _load_builtin()
    return list(_REGISTRY)


@dataclass(frozen=True)
class Param:
    """One parameter of a policy: its name, its type (the resolved annotation: `float`,
    `int | None`, `tuple[float, ...]`, or the dataclass of a group) and its default. A nested
    group (a dataclass-typed parameter) lists its own parameters in `group`."""

    name: str
    type: Any
    default: Any
    group: tuple[Param, ...] | None = None


def policy_params(name: str) -> tuple[Param, ...]:
    """The parameters `get_policy(name, params)` takes, in declaration order; () for none.

    Raises:
        ValueError: no policy of that name.
    """
    return _describe(_factory(name))[0]


def get_policy(name: str, params: Mapping[str, Any] | None = None) -> Policy:
    """A new policy `name`, built with `params` (plain values by parameter name, a nested group as
    a mapping). Only names are checked here; values are taken as given, so a caller that reads
    them from a person (the configuration) validates them first (`trainyard.spec.models.SchedulerSpec`).

    Raises:
        ValueError: no policy of that name, or a parameter it does not take (the message names
            the parameter by its dotted path, e.g. `ordering.reserve_at`).
    """
    factory = _factory(name)
    if not params:
        return factory()  # exactly the factory's default, the one every report was measured with
    declared, whole = _describe(factory)
    if not declared:
        raise ValueError(f"policy {name!r} takes no parameters; got {', '.join(map(repr, params))}")
    aliases = _aliases(whole)
    if aliases:
        params = nest_flat(params, aliases)[0]
    kwargs = _build(name, declared, params, "")
    if whole is not None:
        return factory(whole(**kwargs))
    return factory(**kwargs)


def resolved_params(name: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every parameter of `name` with the value it runs with given `params` (defaults filled in),
    nested groups as dicts, tuples as lists: what a report or an API shows as 'what ran'.

    Raises:
        ValueError: as `get_policy`.
    """
    declared = policy_params(name)
    if params:
        get_policy(name, params)  # the same name checks, the same messages
        aliases = flat_aliases(name)
        if aliases:
            params = nest_flat(params, aliases)[0]

    def fill(decl: tuple[Param, ...], given: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for p in decl:
            if p.group is not None:
                sub = given.get(p.name)
                out[p.name] = fill(p.group, sub if isinstance(sub, Mapping) else {})
            else:
                v = given.get(p.name, p.default)
                out[p.name] = list(v) if isinstance(v, tuple) else v
        return out

    return fill(declared, params or {})


def flat_aliases(name: str) -> dict[str, tuple[str, str]]:
    """The flat parameter names `name` still reads, each with its (group, field); {} for none.

    Raises:
        ValueError: no policy of that name.
    """
    return _aliases(_describe(_factory(name))[1])


def nest_flat(params: Mapping[str, Any], aliases: Mapping[str, tuple[str, str]]) -> tuple[dict[str, Any], list[str]]:
    """`params` with every flat name of `aliases` moved into its group, and the flat names found
    (in the order given). A group given as something else than a mapping is left as it is (its own
    error is the one to report).

    Raises:
        ValueError: a flat name and its nested spelling both given (the message names both).
    """
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in params.items()
                           if k not in aliases}
    found = []
    for name, value in params.items():
        where = aliases.get(name)
        if where is None:
            continue
        found.append(name)
        group = out.get(where[0])
        if group is None:
            group = out[where[0]] = {}
        elif not isinstance(group, dict):
            continue
        if where[1] in group:
            raise ValueError(f"{name!r} and {where[0] + '.' + where[1]!r} are the same parameter; give it once, "
                             f"as {where[0] + '.' + where[1]!r}")
        group[where[1]] = value
    return out, found


def _aliases(whole: type | None) -> dict[str, tuple[str, str]]:
    table = getattr(whole, "FLAT", None) if whole is not None else None
    return dict(table) if isinstance(table, dict) else {}


def _factory(name: str) -> Callable[..., Policy]:
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(_REGISTRY)}") from None


def _build(policy: str, declared: tuple[Param, ...], given: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """Keyword arguments for a factory or a group's dataclass, groups built recursively."""
    by_name = {p.name: p for p in declared}
    out: dict[str, Any] = {}
    for key, value in given.items():
        p = by_name.get(key)
        if p is None:
            raise ValueError(f"policy {policy!r} has no parameter {prefix + str(key)!r}; "
                             f"known: {', '.join(by_name)}")
        if p.group is not None:
            if value is None:
                continue  # an empty group (`ordering:` with nothing under it): its defaults
            if not isinstance(value, Mapping):
                raise ValueError(f"policy {policy!r}: parameter {prefix + key!r} is a group; give a mapping")
            value = p.type(**_build(policy, p.group, value, f"{prefix}{key}."))
        out[key] = value
    return out


@functools.lru_cache(maxsize=None)
def _describe(factory: Callable[..., Policy]) -> tuple[tuple[Param, ...], type | None]:
    """(parameters, the dataclass a factory takes whole or None), read from its signature."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to configure
        return (), None
    args = [a for a in sig.parameters.values()
            if a.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    if not args:
        return (), None
    hints = typing.get_type_hints(getattr(factory, "__init__") if isinstance(factory, type) else factory)
    if len(args) == 1:
        whole = _dataclass_in(hints.get(args[0].name))
        if whole is not None:
            return _fields(whole), whole
    out = []
    for a in args:
        if a.default is inspect.Parameter.empty:
            raise TypeError(f"{factory!r}: parameter {a.name!r} needs a default to be configurable")
        tp = hints.get(a.name, Any)
        group = _dataclass_in(tp)
        default = a.default if group is None or a.default is not None else group()
        out.append(Param(a.name, group or tp, default, _fields(group) if group is not None else None))
    return tuple(out), None


def _fields(dc: type) -> tuple[Param, ...]:
    hints = typing.get_type_hints(dc)
    out = []
    for f in dataclasses.fields(dc):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            raise TypeError(f"{dc.__name__}.{f.name} needs a default to be configurable")
        group = _dataclass_in(hints[f.name])
        out.append(Param(f.name, group or hints[f.name], default, _fields(group) if group is not None else None))
    return tuple(out)


def _dataclass_in(tp: Any) -> type | None:
    """The dataclass `tp` is, or is optionally (`X | None`); else None."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        found = [a for a in typing.get_args(tp) if isinstance(a, type) and dataclasses.is_dataclass(a)]
        if len(found) == 1 and set(typing.get_args(tp)) <= {found[0], type(None)}:
            return found[0]
    return None


def _load_builtin() -> None:
    # Imported for their @register side effect; the order is the order reports list them.
    import trainyard.sched.baselines  # noqa: F401
    import trainyard.sched.engine  # noqa: F401
