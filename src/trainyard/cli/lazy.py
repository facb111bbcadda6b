"""Commands that load their module when they run: `yard queue` imports cli/jobs.py, not the
simulator's, the shell's (asyncio) or the benchmarks' modules too.

Why: every `yard` process paid for every command module (about 0.25 s of CPU before the command
itself started, 0.4 s a run in all), and the test suite starts thousands of them. `cli/main.py` names
each command as "module:attribute" (a function: a command; a `typer.Typer`: a group of them); the
click command is built from it the first time it is asked for (running it, its --help, `yard --help`
listing all of them). The names, their order in `yard --help` and every command's options are the
same as when main.py imported them all: the command is made by Typer from the same function.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import typer
from typer.core import TyperGroup

try:  # Typer >= 0.20 carries its own copy of click
    from typer import _click as click
except ImportError:  # pragma: no cover - older Typer: click itself
    import click  # type: ignore[no-redef]


@dataclass(frozen=True)
class Lazy:
    """One command of `yard`: where it lives ("module:attribute" under trainyard.cli) and what
    `app.command` would have been given for it (cls, context_settings)."""

    target: str
    settings: dict[str, Any] = field(default_factory=dict)

    def load(self, name: str) -> click.Command:
        module, attr = self.target.split(":")
        obj = getattr(importlib.import_module(f"trainyard.cli.{module}"), attr)
        holder = typer.Typer()  # built as main.py's app.command / app.add_typer would have
        if isinstance(obj, typer.Typer):
            holder.add_typer(obj, name=name, **self.settings)
        else:
            holder.command(name, **self.settings)(obj)
        return typer.main.get_group(holder).commands[name]


class LazyCommands(dict):
    """A group's commands by name, each made when first looked up. A dict (what click and Typer's
    own code, and tests walking the tree, expect) whose keys are all the names, in table order."""

    def __init__(self, loaded: dict[str, click.Command], table: dict[str, Lazy]):
        super().__init__(loaded)
        self.table = table

    def __missing__(self, name: str) -> click.Command:
        if name not in self.table:
            raise KeyError(name)
        cmd = self.table[name].load(name)
        dict.__setitem__(self, name, cmd)
        return cmd

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name) or name in self.table

    def keys(self) -> list[str]:  # type: ignore[override]
        return [*self.table, *(n for n in dict.keys(self) if n not in self.table)]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def items(self) -> list[tuple[str, click.Command]]:  # type: ignore[override]
        return [(n, self[n]) for n in self.keys()]

    def values(self) -> list[click.Command]:  # type: ignore[override]
        return [self[n] for n in self.keys()]


def lazy_group(table: dict[str, Lazy]) -> type[TyperGroup]:
    """The group class for `typer.Typer(cls=...)` whose commands are `table`'s, loaded on use."""

    class LazyGroup(TyperGroup):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.commands = LazyCommands(dict(self.commands), table)

        def list_commands(self, ctx: click.Context) -> list[str]:
            return list(self.commands.keys())

    return LazyGroup
