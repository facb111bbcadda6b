"""Where a job may run: Slurm's placement options as the engine reads them.

`-C/--constraint` (node features), the GPU model of `--gpus=TYPE:N` / `--gres=gpu:TYPE:N`,
`-w/--nodelist` (nodes the job must include), `-x/--exclude` (nodes it must not use) and
`--exclusive` (whole nodes) become one `Where` on the job's `JobRequest`: frozen and hashable, so
the cycle's memos (shapes that did not fit, searches that found no victims) tell constrained
jobs apart from unconstrained ones of the same size, and `None` for the many jobs that ask for
none of it costs nothing.

Feature expressions are Slurm's simple ones: a name, names joined by `&` (AND) or by `|` (OR),
and parentheses to group them (`(a100|h100)&ib`). `&` and `|` mixed at one level without
parentheses are refused rather than read by a precedence the user may not have meant (Slurm's
own evaluation is left to right, which differs from the usual one); brackets (matching OR), counts
(`a*2`), `!` and `,` are refused with a message. Names are case-sensitive, as Slurm's are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Sequence, Union

if TYPE_CHECKING:
    from trainyard.sched.cluster import Node

# A parsed expression: a feature name, or (operator, operands) with operator "&" or "|".
Expr = Union[str, tuple[str, tuple["Expr", ...]]]

FEATURE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=:+-]*")
_TOKEN = re.compile(r"\s*(?:([A-Za-z0-9_][A-Za-z0-9_.=:+-]*)|(.))")
_REFUSED = {
    "[": "brackets (Slurm's matching OR and feature counts) are not supported; use & (AND), | (OR) and parentheses",
    "]": "brackets (Slurm's matching OR and feature counts) are not supported; use & (AND), | (OR) and parentheses",
    "*": "feature counts (name*N) are not supported; use & (AND), | (OR) and parentheses",
    "!": "NOT (!) is not supported; use & (AND), | (OR) and parentheses",
    ",": "',' is not an operator; use & for AND, | for OR",
}
MAX_EXPR = 1000  # characters: an expression is a few names, not a document


class ConstraintError(ValueError):
    """A feature expression that cannot be read; the message says where and why."""


@lru_cache(maxsize=4096)
def parse_features(text: str) -> Expr:
    """`a`, `a&b`, `a|b`, `(a|b)&c` → the expression; cached, as the same few texts recur.

    Raises:
        ConstraintError: empty, too long, an unknown or unsupported character, unbalanced
            parentheses, a missing name, or `&` and `|` mixed without parentheses.
    """
    if len(text) > MAX_EXPR:
        raise ConstraintError(f"longer than {MAX_EXPR} characters")
    tokens: list[str] = []
    for m in _TOKEN.finditer(text):
        name, op = m.group(1), m.group(2)
        if name:
            tokens.append(name)
        elif op in ("&", "|", "(", ")"):
            tokens.append(op)
        elif op in _REFUSED:
            raise ConstraintError(f"{op!r} in {text!r}: {_REFUSED[op]}")
        elif op is not None and not op.isspace():
            raise ConstraintError(f"unexpected {op!r} in {text!r}: feature names are letters, digits and _.=:+-")
    if not tokens:
        raise ConstraintError("empty; give a feature name, or names joined by & (AND) or | (OR)")
    expr, at = _group(tokens, 0, text)
    if at != len(tokens):
        raise ConstraintError(f"unexpected {tokens[at]!r} in {text!r}")
    return expr


def _group(tokens: list[str], at: int, text: str) -> tuple[Expr, int]:
    """Operands joined by one operator, from `at` up to a `)` or the end."""
    operands: list[Expr] = []
    op: str | None = None
    while True:
        if at >= len(tokens):
            raise ConstraintError(f"{text!r} ends where a feature name is expected")
        t = tokens[at]
        if t == "(":
            inner, at = _group(tokens, at + 1, text)
            if at >= len(tokens) or tokens[at] != ")":
                raise ConstraintError(f"unbalanced parentheses in {text!r}")
            operands.append(inner)
            at += 1
        elif t in ("&", "|", ")"):
            raise ConstraintError(f"{t!r} in {text!r} where a feature name is expected")
        else:
            operands.append(t)
            at += 1
        if at >= len(tokens) or tokens[at] == ")":
            break
        nxt = tokens[at]
        if nxt not in ("&", "|"):
            raise ConstraintError(f"{nxt!r} in {text!r}: join feature names with & (AND) or | (OR)")
        if op is not None and nxt != op:
            raise ConstraintError(f"{text!r} mixes & and | without parentheses; group them, e.g. (a|b)&c")
        op = nxt
        at += 1
    if len(operands) == 1:
        return operands[0], at
    return (op or "&", tuple(operands)), at


def feature_names(expr: Expr) -> list[str]:
    """Every name the expression mentions, in order, once."""
    if isinstance(expr, str):
        return [expr]
    out: list[str] = []
    for e in expr[1]:
        out += [n for n in feature_names(e) if n not in out]
    return out


def matches(expr: Expr, features: frozenset[str]) -> bool:
    if isinstance(expr, str):
        return expr in features
    op, operands = expr
    if op == "&":
        return all(matches(e, features) for e in operands)
    return any(matches(e, features) for e in operands)


@dataclass(frozen=True, slots=True)
class Where:
    """A job's placement constraints. `constraint` is the `-C` text as given (parsed, cached, on
    use); `include` the nodes it must have (`-w`), `exclude` those it must not (`-x`);
    `exclusive`: it takes whole nodes, every GPU of each (as Slurm's `--exclusive` allocates the
    whole node), and only nodes nothing else uses."""

    constraint: str | None = None
    gpu_model: str | None = None
    include: frozenset[str] = frozenset()
    exclude: frozenset[str] = frozenset()
    exclusive: bool = False

    def allows(self, node: Node) -> bool:  # (a cluster.Node; imported for annotations only: no cycle)
        """Whether `node` may hold any part of the job (its model, features and name)."""
        if self.gpu_model is not None and node.gpu_model != self.gpu_model:
            return False
        if node.name in self.exclude:
            return False
        return self.constraint is None or matches(parse_features(self.constraint), node.features)

    def banned(self, nodes: Sequence[Node]) -> frozenset[int]:
        """Indices of the nodes the job may not use."""
        if self.gpu_model is None and not self.exclude and self.constraint is None:
            return frozenset()
        return frozenset(i for i, n in enumerate(nodes) if not self.allows(n))

    def required(self, nodes: Sequence[Node]) -> list[int]:
        """Indices of the `include` nodes, in node order (a name the nodes lack is left out:
        submission refuses unknown names, and a node gone from the configuration cannot be had)."""
        return [i for i, n in enumerate(nodes) if n.name in self.include] if self.include else []


def where_of(constraint: str | None = None, gpu_model: str | None = None, include: Sequence[str] | None = None,
             exclude: Sequence[str] | None = None, exclusive: bool = False) -> Where | None:
    """The `Where` of these options, or None when they ask for nothing (most jobs)."""
    if not (constraint or gpu_model or include or exclude or exclusive):
        return None
    return Where(constraint or None, gpu_model or None, frozenset(include or ()), frozenset(exclude or ()),
                 bool(exclusive))
