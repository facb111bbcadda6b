"""The `stragglers:` section of the cluster configuration (issue 39; docs/control-plane.md,
"Stragglers and suspect nodes").

    stragglers:
      enabled: true          # the plane reads the ranks' phase files and flags slow ranks
      factor: 1.5            # a rank whose median own work per step exceeds the gang's median by this
      window: 10             # over the newest this-many steps every rank of the job has reported
      suspect_window: 1h     # a node flagged in two unrelated jobs within this becomes suspect

Why these defaults: one step's time varies by tens of percent with the data and the machine's
load, so a median over ten steps and a factor of 1.5 tell a rank that is steadily slower from one
unlucky step; an hour is long enough that two jobs of the same hour meet a slow node, short enough
that two flags days apart (each the job's own doing) do not add up.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from trainyard.contracts import PHASES_RECENT
from trainyard.spec import bounds as B
from trainyard.spec.parsing import parse_duration

_Duration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0, le=B.MAX_DURATION_S)]


class StragglersSpec(BaseModel):
    """See the module docstring."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    enabled: bool = True
    factor: float = Field(1.5, gt=1, le=100, allow_inf_nan=False)
    # at least 3 steps for a median; at most what a phase file keeps (contracts.PHASES_RECENT)
    window: int = Field(10, ge=3, le=PHASES_RECENT, strict=True)
    suspect_window: _Duration = 3600.0
