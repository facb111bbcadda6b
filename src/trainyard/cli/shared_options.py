"""Commands that take another function's options: `yard alloc`, `yard srun --pty` and `yard notebook`
take `yard submit`'s (cli/jobs.py `job_request`), so each option is declared, explained and checked
once and the commands cannot drift apart.

Typer reads a command's options from its signature (`inspect.signature`, which honours
`__signature__`) and its type hints (`__annotations__`): `with_options` gives a command, whose own
parameters end with `**options`, the options of another function beside its own, their types
resolved where they were written.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any, Callable, Iterable, TypeVar

from typer.models import ParameterInfo

F = TypeVar("F", bound=Callable[..., Any])


def borrowed(source: Callable[..., Any], drop: Iterable[str] = ()) -> list[inspect.Parameter]:
    """`source`'s Typer options (parameters whose default is a `typer.Option`/`Argument`), but those
    named in `drop`, with their types resolved."""
    hints = typing.get_type_hints(source)
    skip = set(drop)
    return [p.replace(annotation=hints.get(p.name, p.annotation))
            for p in inspect.signature(source).parameters.values()
            if p.name not in skip and isinstance(p.default, ParameterInfo)]


def with_options(source: Callable[..., Any], drop: Iterable[str] = ()) -> Callable[[F], F]:
    """A decorator: the command's parameters without a default (the Typer context) come first, then
    `source`'s options (but `drop`), then the command's own options; the borrowed ones reach it in
    `**options`, by name."""
    def wrap(command: F) -> F:
        hints = typing.get_type_hints(command)
        own = [p.replace(annotation=hints.get(p.name, p.annotation))
               for p in inspect.signature(command).parameters.values() if p.kind is not p.VAR_KEYWORD]
        theirs = borrowed(source, drop)
        clash = {p.name for p in own} & {p.name for p in theirs}
        if clash:
            raise TypeError(f"{command.__name__}: parameters {sorted(clash)} are also {source.__name__}'s")
        first = [p for p in own if p.default is p.empty]
        params = [*first, *theirs, *(p for p in own if p.default is not p.empty)]
        params = [p.replace(kind=p.POSITIONAL_OR_KEYWORD) for p in params]
        setattr(command, "__signature__", inspect.Signature(params, return_annotation=hints.get("return")))
        command.__annotations__ = {**{p.name: p.annotation for p in params}, "return": hints.get("return")}
        return command
    return wrap
