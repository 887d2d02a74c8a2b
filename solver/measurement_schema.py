"""What a runtime reports after a step: measured times (the wire format, defined once).

The runtime client posts it, the service validates and stores it, the replay CLI reads files of
it. Times are milliseconds of the slowest rank (the step ends when the last rank does).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from solver.input_limits import FewUnknownKeys

MAX_MEASURED_MS = 1e8
"""~28 hours: anything longer for one step is a unit mistake, not a measurement."""

MIN_MEASURED_MS = 1e-3
"""A microsecond: a shorter non-zero time is a unit mistake too, and a denormal one (``5e-324``)
overflowed the job's refit, whose errors are relative to the measured times."""


def _zero_or_measurable(ms: float) -> float:
    if 0 < ms < MIN_MEASURED_MS:
        raise ValueError(
            f"must be 0 or at least {MIN_MEASURED_MS} ms (a microsecond): is it in milliseconds?"
        )
    return ms


Millis = Annotated[
    StrictFloat,
    Field(ge=0, le=MAX_MEASURED_MS, allow_inf_nan=False),
    AfterValidator(_zero_or_measurable),
]
"""Strict: a number (an integer is fine), never ``true`` or ``"5"``, like the plan schema."""


class LayerTimes(BaseModel):
    """Forward + backward wall time of every layer of one kind in the step, summed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    full_ms: Millis = Field(..., description="Full-attention layers, all-to-alls included.")
    sparse_ms: Millis = Field(..., description="Sliding-window + MoE layers, all-to-alls included.")


class StepMeasurement(FewUnknownKeys):
    """One step as it really ran (the body of ``POST /v1/jobs/{job}/steps/{step}/measurements``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step_time_ms: Annotated[
        StrictFloat, Field(ge=MIN_MEASURED_MS, le=MAX_MEASURED_MS, allow_inf_nan=False)
    ] = Field(
        ...,
        description="Whole step (forward, backward, optimizer), slowest rank.",
    )
    layers: LayerTimes | None = Field(None, description="Per layer kind, forward + backward.")
    all_to_all_ms: Millis | None = Field(None, description="Time inside all-to-alls, fwd + bwd.")
    plan_id: str | None = Field(None, min_length=1, max_length=300, description="Plan that ran.")
    ranks: StrictInt | None = Field(None, ge=1, le=1_000_000, description="Ranks that reported.")


class MeasuredStep(StepMeasurement):
    """A measurement with its key, as stored and as written to a ``--measurements`` file."""

    job_id: str = Field(..., min_length=1, max_length=200)
    step: StrictInt = Field(..., ge=0)
