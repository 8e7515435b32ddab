"""What CI and contributors hand the checks. Every evidence file is parsed into these models at the edge.

`PerfEvidence` is shared with `kimi_k3_path.bench`, which writes it: one model, one format.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

AxisValue = str | int | float | bool | None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Hardware(_Strict):
    gpu: str = Field(min_length=1)  # e.g. "NVIDIA H200"
    count: int = Field(ge=1)
    driver: str = Field(min_length=1)
    arch: str | None = None  # e.g. "sm_90"


class Measurement(_Strict):
    """Median and spread of `runs` timings of one variant. spread_pct = (p90 - p10) / median * 100."""

    median: float = Field(gt=0)
    spread_pct: float = Field(ge=0)
    runs: int = Field(ge=1)

    @field_validator("median", "spread_pct")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


class PerfRow(_Strict):
    axes: dict[str, AxisValue]  # the deployment axes of the support matrix, plus extra axes (e.g. layer)
    metric: str = "latency"
    unit: Literal["us", "ms", "s", "tokens/s"] = "us"
    candidate: Measurement
    baseline: Measurement | None = None  # None: no baseline in this run, which the check rejects
    floor: float | None = Field(default=None, gt=0)  # the byte floor in the same unit, where known
    note: str = ""

    @property
    def speedup(self) -> float | None:
        """Baseline over candidate for times; candidate over baseline for rates."""
        if self.baseline is None:
            return None
        if self.unit == "tokens/s":
            return self.candidate.median / self.baseline.median
        return self.baseline.median / self.candidate.median


class PerfEvidence(_Strict):
    """One benchmark run on one machine: the baseline and the candidate of every row measured together."""

    schema_version: Literal[1] = 1
    kind: Literal["perf_matrix"] = "perf_matrix"
    commit: str = Field(pattern=r"^[0-9a-f]{7,40}$")
    command: str = Field(min_length=1)
    created: datetime
    hardware: Hardware
    software: dict[str, str] = Field(default_factory=dict)
    rows: tuple[PerfRow, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_rows(self) -> PerfEvidence:
        seen: set[tuple] = set()
        for row in self.rows:
            key = (tuple(sorted((k, repr(v)) for k, v in row.axes.items())), row.metric)
            if key in seen:
                raise ValueError(f"duplicate row for axes {row.axes} and metric {row.metric!r}")
            seen.add(key)
        return self


class Evidence(_Strict):
    """Everything handed to the checks besides the change itself. Extended by the evidence issue (#3) with
    test/coverage results and guard probe results; each part says whether it is trusted or self-reported."""

    schema_version: Literal[1] = 1
    perf: tuple[PerfEvidence, ...] = ()
