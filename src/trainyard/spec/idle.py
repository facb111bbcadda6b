"""A job class's idle policy (issue 39, Deliver 3): what happens to a job that holds GPUs and does nothing.

    classes:
      - name: training
        idle:
          after: 30m            # idle this long (a duration, > 0): the action
          below: 5%             # idle while its CPU (all its processes, of one CPU) and its busiest
                                # GPU stay below this: "5%" or 5 (default 5%)
          action: requeue       # notify | requeue | cancel (default notify)
          warning: 1m           # the warning comes this long before `after` (default: 1m, at most
                                # half of `after`); 0: none
          exempt_teams: [infra] # their jobs are never judged
          max_requeues: 1       # idle requeues in a row before the next idle stretch cancels it

The loop's step (control/loop/idle.py) judges every running job of such a class: once per idle
stretch a warning (event `job.idle_warning`, an IDLE_WARNING message), then at `after` (at least
`warning` after the warning: a pass that came late on a loaded plane warns first and acts later)
the event `job.idle` and an IDLE message, and the action: `notify` nothing more; `requeue` back to the queue
(checkpoint notice first, as a preemption; reason `Idle`); `cancel` CANCELLED, reason `Idle`. An
interactive allocation (`yard alloc`) ends TIMEOUT, reason `IdleTimeout`, under `requeue` or
`cancel`: its session is over, and there is nothing to requeue.

Issue 38's `idle_timeout: X` on a class still works and keeps its meaning: `idle: {after: X,
action: cancel}` for the class's allocations only, with `interactive.idle_cpu_percent` as `below`
and `interactive.idle_warning` as `warning` (`policies`). A class gives one or the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from trainyard.spec import bounds as B
from trainyard.spec.parsing import parse_duration

if TYPE_CHECKING:
    from trainyard.spec.models import ConfigSpec

DEFAULT_WARNING_S = 60.0
ACTIONS = ("notify", "requeue", "cancel")


def parse_percent(value: Any) -> Any:
    """A percent from `5`, `5.5` or `"5%"`; anything else is left to the field's own check."""
    if isinstance(value, bool):  # YAML's `yes` is a mistake, not 1%
        raise ValueError("a percent must be a number or a string such as '5%'")
    if isinstance(value, str):
        text = value.strip()
        if not text.endswith("%"):
            raise ValueError(f"cannot read {value!r} as a percent (examples: 5, '5%', '0.5%')")
        try:
            return float(text[:-1].strip())
        except ValueError:
            raise ValueError(f"cannot read {value!r} as a percent (examples: 5, '5%', '0.5%')") from None
    return value


_After = Annotated[float, BeforeValidator(parse_duration), Field(gt=0, le=B.MAX_DURATION_S)]
_Warning = Annotated[float | None, BeforeValidator(parse_duration), Field(ge=0, le=B.MAX_DURATION_S)]
_Percent = Annotated[float, BeforeValidator(parse_percent), Field(gt=0, le=100, allow_inf_nan=False)]


class IdleSpec(BaseModel):
    """A class's `idle:` (the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    after: _After
    below: _Percent = 5.0
    action: Literal["notify", "requeue", "cancel"] = "notify"
    warning: _Warning = None
    exempt_teams: list[Annotated[str, Field(min_length=1, max_length=B.MAX_NAME)]] = Field(
        default_factory=list, max_length=B.MAX_TEAMS)
    max_requeues: int = Field(1, ge=0, le=100, strict=True)

    @model_validator(mode="after")
    def _warning_before_after(self) -> "IdleSpec":
        if self.warning is not None and self.warning >= self.after:
            raise ValueError(f"idle.warning ({self.warning:g} s) must be shorter than idle.after ({self.after:g} s)")
        return self

    def warning_s(self) -> float:
        """The warning's lead: as given, else a minute, at most half of `after`."""
        return self.warning if self.warning is not None else min(DEFAULT_WARNING_S, self.after / 2)


@dataclass(frozen=True)
class IdlePolicy:
    """One class's policy as the loop's step reads it, whichever form the configuration used."""

    after: float
    below: float
    action: str  # notify | requeue | cancel
    warning: float
    exempt_teams: frozenset[str] = frozenset()
    max_requeues: int = 1
    allocations_only: bool = False  # issue 38's `idle_timeout`: the class's allocations only


def policies(spec: "ConfigSpec") -> dict[str, IdlePolicy]:
    """Every class with an idle policy → its policy (`idle:`, or the old `idle_timeout`)."""
    out: dict[str, IdlePolicy] = {}
    for c in spec.classes:
        if c.idle is not None:
            out[c.name] = IdlePolicy(c.idle.after, c.idle.below, c.idle.action, c.idle.warning_s(),
                                     frozenset(c.idle.exempt_teams), c.idle.max_requeues)
        elif c.idle_timeout:
            out[c.name] = IdlePolicy(c.idle_timeout, spec.interactive.idle_cpu_percent, "cancel",
                                     spec.interactive.idle_warning, allocations_only=True)
    return out
