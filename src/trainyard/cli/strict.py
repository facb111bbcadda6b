"""Command parsing that never guesses (`yard submit`).

`yard submit` takes a command after its options, and once took anything it did not know as the
start of that command: `yard submit --mem 4G -G 1 -- true` (before `--mem` existed) stored the
command `--mem 4G true`, which failed only at launch. Here, as in sbatch, options are read up to
the first word that is not one (the script or the command, whose own options follow it) or up to
`--`; an option the command does not know before that is an error naming it, exit code 2, and
nothing is sent to the server. Every other usage error (a missing value, a value of the wrong
type) is the same one line `error: …` as the rest of the CLI (`cli/common.py`), not Click's
usage box.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand

try:  # Typer 0.2x carries its own copy of Click: its exceptions are not the `click` package's
    from typer._click.exceptions import NoSuchOption, UsageError
except ImportError:  # an older Typer, on Click itself
    from click.exceptions import NoSuchOption, UsageError  # type: ignore[assignment]

from trainyard.cli.common import fail
from trainyard.cli import prefixes
from trainyard.cli.refused import REFUSED, refusal

# What the command needs on top of its class: extra words are the command, and they start at the
# first word that is not an option.
CONTEXT = {"allow_extra_args": True, "allow_interspersed_args": False}
AFTER_DASHDASH = "trainyard.after_dashdash"  # ctx.meta key: the command was given after `--`


class StrictCommand(TyperCommand):
    """A Typer command whose usage errors are one line naming the option, exit code 2."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.meta[AFTER_DASHDASH] = "--" in args  # Click drops it; `yard submit` needs to know it was there
        args = self.expand_prefixes(args)
        try:
            return super().parse_args(ctx, args)
        except NoSuchOption as e:
            fail(refusal(e.option_name) or unknown_option(e.option_name, e.possibilities, ctx.command_path))
        except UsageError as e:
            fail(e.format_message())


    def expand_prefixes(self, args: list[str]) -> list[str]:
        """`args` with each abbreviated long option before the command spelled out, as sbatch
        reads them (`--tim=10` → `--time=10`; cli/prefixes.py); an ambiguous one is an error
        naming the candidates. The command's own words (after `--` or the first non-option) are
        left alone."""
        takes_value: dict[str, bool] = {}
        for p in self.params:
            for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ())):
                takes_value[o] = not (getattr(p, "is_flag", False) or getattr(p, "count", False))
        known = [o for o in takes_value if o.startswith("--")] + [o for o in REFUSED if o.startswith("--")]
        out, i = list(args), 0
        while i < len(out):
            w = out[i]
            if w == "--" or not w.startswith("-") or w == "-":
                break
            name, eq, val = w.partition("=")
            if name.startswith("--"):
                try:
                    full = prefixes.expand(name, known) or name
                except prefixes.AmbiguousOption as e:
                    fail(str(e))
                out[i] = full + eq + val
                i += 2 if takes_value.get(full) and not eq else 1
            else:  # -N 2, -N2, -H
                i += 2 if takes_value.get(name[:2]) and len(name) == 2 else 1
        return out


def unknown_option(name: str, possibilities: Any, command: str) -> str:
    near = sorted(possibilities or [])
    hint = f" (did you mean {' or '.join(near)}?)" if near else ""
    return (f"{name}: {command} has no such option{hint}; options of the job's own command go after "
            f"`--` or after the command (see {command} --help)")
