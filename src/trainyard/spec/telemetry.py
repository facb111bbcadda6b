"""The `telemetry:` section of the cluster configuration: per-GPU telemetry (issue 39;
control/lifecycle/telemetry.py; docs/control-plane.md, "GPU telemetry").

    telemetry:
      enabled: true            # sample the nodes' GPUs at all
      interval: 1s             # how often the node agents are read
      flush: 15s               # one gpu_samples row per GPU per this period (mean and peak util,
                               # peak memory, mean power, highest temperature)
      max_rows_per_job: 2000   # over this, a job's oldest half is thinned by merging pairs of rows
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from trainyard.spec.parsing import parse_duration

MIN_INTERVAL_S = 0.1  # ten readings a second is the most the sampler is asked for
MAX_INTERVAL_S = 3600.0


class TelemetrySpec(BaseModel):
    """See the module docstring."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    interval: Annotated[float, BeforeValidator(parse_duration), Field(ge=MIN_INTERVAL_S, le=MAX_INTERVAL_S)] = 1.0
    flush: Annotated[float, BeforeValidator(parse_duration), Field(ge=MIN_INTERVAL_S, le=24 * 3600.0)] = 15.0
    max_rows_per_job: int = Field(2000, ge=10, le=1_000_000, strict=True)

    @model_validator(mode="after")
    def _flush_after_interval(self) -> "TelemetrySpec":
        if self.flush < self.interval:
            raise ValueError(f"telemetry.flush ({self.flush:g}s) must be at least telemetry.interval "
                             f"({self.interval:g}s): a row sums up the readings of its period")
        return self
