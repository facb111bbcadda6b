"""The `interactive:` section of the cluster configuration: allocations, terminals, forwarded ports
and notebooks (issue 38; docs/control-plane.md, "Interactive work").

    interactive:
      class: interactive            # the class of `yard alloc`, `yard srun --pty`, `yard notebook`
                                    # when they name none (absent from `classes`: the default class)
      connection_grace: 2m          # an allocation with no terminal and no forwarded port attached
                                    # for this long ends (ConnectionLost); counted from its start
      operators_may_attach: false   # operators may also open terminals and forward ports
      idle_cpu_percent: 5           # the old `idle_timeout`'s threshold: below this (of one CPU, the
                                    # job's processes together) an allocation counts as idle
      idle_warning: 1m              # the old `idle_timeout`'s warning, this long before the end

A class says what happens to its idle jobs with `idle:` (spec/idle.py: its own `below` and
`warning`), which covers allocations too: one under `requeue` or `cancel` ends TIMEOUT, reason
`IdleTimeout`. Issue 38's `idle_timeout` on a class still works as its allocations-only form:
an interactive allocation of it with no terminal input, no forwarded traffic, its processes below
`idle_cpu_percent` (and its GPUs idle where they are read) for that long ends with reason
`IdleTimeout`, warned `idle_warning` before.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from trainyard.spec import bounds as B
from trainyard.spec.parsing import parse_duration

_Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0, le=B.MAX_DURATION_S)]


class InteractiveSpec(BaseModel):
    """See the module docstring."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    class_name: str = Field("interactive", alias="class", min_length=1, max_length=100)
    connection_grace: _Duration = 120.0
    operators_may_attach: bool = False
    idle_cpu_percent: float = Field(5.0, ge=0, le=100_000)
    idle_warning: _Duration = 60.0
