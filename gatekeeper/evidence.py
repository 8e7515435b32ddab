"""What CI and contributors hand the checks. Every evidence file is parsed into these models at the edge.

`PerfEvidence` is the contract with the benchmarks that write it (benchmarks/kimi_k3/bench.py): its JSON Schema is
committed as schemas/perf_evidence.v1.json, tests keep the two equal, and the bench's output is validated against
the file, so a contribution never has to import the checker to speak its format.

Every part of an `Evidence` says where it came from (`Origin`): *trusted* when the collector produced it in
a workflow defined on the base branch, *self-reported* when it was committed in the pull request or pasted
in its body. Trust is assigned by whoever loads a part, never read from the part itself: a file in the PR
cannot call itself trusted.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gatekeeper.errors import InputError

AxisValue = str | int | float | bool | None
Trust = Literal["trusted", "self_reported"]

# Hostile or runaway inputs are refused before parsing: an evidence file is data, not a denial of service.
MAX_EVIDENCE_BYTES = 64 * 1024 * 1024
MAX_PERF_BYTES = 2 * 1024 * 1024
MAX_MESSAGE_CHARS = 4000


def clip(message: str) -> str:
    """A message cut to what evidence may hold, keeping its end (where a traceback says what went wrong)."""
    return message if len(message) <= MAX_MESSAGE_CHARS else "…" + message[-(MAX_MESSAGE_CHARS - 1):]


class _Strict(BaseModel):
    # NaN and infinity are never a measurement; unknown keys are typos until proven otherwise.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Origin(_Strict):
    trust: Trust
    source: str = Field(min_length=1)  # e.g. "gatekeeper collect (GitHub Actions)", "PR file perf/h200.json"


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


class PerfSubmission(_Strict):
    """A `PerfEvidence` together with where it came from."""

    origin: Origin
    evidence: PerfEvidence


class HeadInfo(_Strict):
    """The commit the collector ran on, and its nearest ancestors (newest first), for the perf commit window."""

    sha: str = Field(pattern=r"^[0-9a-f]{40}$")
    ancestors: tuple[str, ...] = ()
    # For commit_window_counts: owned, the commits among the head and its ancestors that change the owned paths,
    # newest first (at most commit_window + 1 of them: older ones can no longer matter).
    owned_changes: tuple[str, ...] | None = None


class TestCase(_Strict):
    __test__ = False  # a model, not a pytest test class

    id: str = Field(min_length=1)  # the pytest node id where known, else "classname::name" from JUnit
    outcome: Literal["passed", "failed", "error", "skipped"]
    message: str = Field(default="", max_length=MAX_MESSAGE_CHARS)


class FileCoverage(_Strict):
    """Per-test line coverage of one file. `covered` maps a line to indexes into the run's `contexts`."""

    path: str = Field(min_length=1)
    statements: tuple[int, ...]             # executable lines (a statement is counted at its first line)
    spans: tuple[tuple[int, int], ...] = ()  # (first, last) line of every statement spanning several lines
    excluded: tuple[int, ...] = ()          # lines excluded from measurement (e.g. `# pragma: no cover`)
    covered: dict[int, tuple[int, ...]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _lines_are_positive(self) -> FileCoverage:
        for line in (*self.statements, *self.excluded, *self.covered, *(n for span in self.spans for n in span)):
            if line < 1:
                raise ValueError(f"line numbers start at 1, got {line}")
        for first, last in self.spans:
            if last < first:
                raise ValueError(f"span ({first}, {last}) ends before it starts")
        return self


class TestRun(_Strict):
    """One run of the test command (or one attached GPU report): outcomes, and coverage with contexts."""

    __test__ = False

    origin: Origin
    label: str = Field(min_length=1)     # "tests" for the collector's run, the report path for a GPU report
    command: str = ""
    exit_code: int | None = None
    error: str | None = Field(default=None, max_length=MAX_MESSAGE_CHARS)  # crashed, hung, unreadable reports
    notes: tuple[str, ...] = ()          # what the collector left out of this run, and why (shown as warnings)
    tests: tuple[TestCase, ...] = ()
    contexts: tuple[str, ...] = ()       # test ids that executed code; "(collection)" is import time
    files: tuple[FileCoverage, ...] = ()

    @model_validator(mode="after")
    def _contexts_in_range(self) -> TestRun:
        for file in self.files:
            for line, indexes in file.covered.items():
                bad = [i for i in indexes if not 0 <= i < len(self.contexts)]
                if bad:
                    raise ValueError(f"{file.path}:{line} refers to unknown contexts {bad}")
        return self

    def context_names(self, indexes: tuple[int, ...]) -> tuple[str, ...]:
        return tuple(self.contexts[i] for i in indexes)


class ProbeResult(_Strict):
    """What happened when one policy probe's deployment was handed to the guard."""

    name: str = Field(min_length=1)
    outcome: Literal["accepted", "raised", "error"]  # error: the deployment could not even be built
    exception_types: tuple[str, ...] = ()  # qualified names of the raised type and its bases, most derived first
    message: str = Field(default="", max_length=MAX_MESSAGE_CHARS)
    # probe_builder: vllm: the deployment as the built VllmConfig states it (the platform faked to `arch`).
    deployment: dict[str, Any] = Field(default_factory=dict)


class GuardProbeRun(_Strict):
    origin: Origin
    guard: str
    error: str | None = Field(default=None, max_length=MAX_MESSAGE_CHARS)  # import failed, timed out, crashed
    results: tuple[ProbeResult, ...] = ()
    # What the probes assumed that the machine could not show (the faked platform of probe_builder: vllm).
    assumptions: tuple[str, ...] = ()


class SupportAxes(_Strict):
    """The axes the declared support matrix admits, as recorded by importing it (the perf matrix covers them)."""

    origin: Origin
    source: str
    axes: dict[str, tuple[AxisValue, ...]] | None = None
    error: str | None = Field(default=None, max_length=MAX_MESSAGE_CHARS)

    @model_validator(mode="after")
    def _axes_or_error(self) -> SupportAxes:
        if (self.axes is None) == (self.error is None):
            raise ValueError("exactly one of axes and error must be given")
        for name, values in (self.axes or {}).items():
            if not values:
                raise ValueError(f"axis {name!r} has no values")
        return self


class PackageEvidence(_Strict):
    """What the collector recorded for one owned package of a policy with `packages`."""

    tests: tuple[TestRun, ...] = ()
    guard_probes: GuardProbeRun | None = None
    support_axes: SupportAxes | None = None
    # The same probes and matrix run on the base commit: what the change admits that the base did not.
    base_guard_probes: GuardProbeRun | None = None
    base_support_axes: SupportAxes | None = None


class Evidence(_Strict):
    """Everything handed to the checks besides the change itself. The top-level tests, probes and axes are the
    one-package shorthand's; a policy with `packages` has them per package, in `packages`."""

    schema_version: Literal[1] = 1
    head: HeadInfo | None = None
    tests: tuple[TestRun, ...] = ()
    guard_probes: GuardProbeRun | None = None
    support_axes: SupportAxes | None = None
    base_guard_probes: GuardProbeRun | None = None
    base_support_axes: SupportAxes | None = None
    perf: tuple[PerfSubmission, ...] = ()
    packages: dict[str, PackageEvidence] = Field(default_factory=dict)
    # The head's source of the modules the static guard check reads (guards, entry points, support matrices),
    # path -> text: a verdict made from the PR's files alone (no checkout) can still read them.
    head_sources: dict[str, str] = Field(default_factory=dict)

    def for_package(self, name: str) -> Evidence:
        """The evidence one package's checks read: its own part where the collector recorded one by name."""
        own = self.packages.get(name)
        if own is None:
            return self
        return self.model_copy(update={**{field: getattr(own, field) for field in PackageEvidence.model_fields},
                                       "packages": {}})

    @field_validator("perf", mode="before")
    @classmethod
    def _attribute_bare_perf(cls, value: Any) -> Any:
        # A bare PerfEvidence (the scaffold's format, and what the bench writes) carries no origin:
        # label it self-reported, the safe default.
        if not isinstance(value, (list, tuple)):
            return value
        return [
            {"origin": _UNATTRIBUTED, "evidence": item}
            if isinstance(item, PerfEvidence) or (isinstance(item, dict) and "evidence" not in item)
            else item
            for item in value
        ]


_UNATTRIBUTED = Origin(trust="self_reported", source="perf evidence without a stated origin")


def demote(evidence: Evidence, why: str) -> Evidence:
    """The same evidence with every part labelled self-reported, saying why: what a loader does when the
    workflow that produced it was one the pull request could edit."""

    def relabel(origin: Origin) -> Origin:
        return Origin(trust="self_reported", source=f"{origin.source} (self-reported: {why})")

    def parts(holder: Evidence | PackageEvidence) -> dict[str, Any]:
        update: dict[str, Any] = {"tests": tuple(t.model_copy(update={"origin": relabel(t.origin)}) for t in holder.tests)}
        for name in ("guard_probes", "support_axes", "base_guard_probes", "base_support_axes"):
            part = getattr(holder, name)
            update[name] = part and part.model_copy(update={"origin": relabel(part.origin)})
        return update

    return evidence.model_copy(update={
        **parts(evidence),
        "perf": tuple(p.model_copy(update={"origin": relabel(p.origin)}) for p in evidence.perf),
        "packages": {name: part.model_copy(update=parts(part)) for name, part in evidence.packages.items()},
    })


def combine_evidence(files: list[tuple[str, Evidence]]) -> Evidence | None:
    """One Evidence from several files: list parts are concatenated; a single-valued part may come from
    one file only (two test runs are fine, two different guard-probe runs are a contradiction)."""
    if not files:
        return None
    if len(files) == 1:
        return files[0][1]
    combined: dict[str, object] = {}
    given_by: dict[str, str] = {}
    for path, evidence in files:
        for name in Evidence.model_fields:
            value = getattr(evidence, name)
            if name == "schema_version" or value is None or (isinstance(value, dict) and not value):
                continue
            if isinstance(value, tuple):
                combined[name] = combined.get(name, ()) + value
            elif name == "head_sources":
                for source, text in value.items():
                    if combined.setdefault(name, {}).setdefault(source, text) != text:
                        raise InputError(path, f"head_sources: {source} differs from another evidence file's")
            elif name == "packages":
                for package, part in value.items():
                    packages = combined.setdefault("packages", {})
                    if package in packages and packages[package] != part:
                        raise InputError(path, f"package {package!r} is also given by {given_by[f'package {package}']}; "
                                               "give it in one evidence file only")
                    packages[package], given_by[f"package {package}"] = part, path
            elif name in combined and combined[name] != value:
                raise InputError(path, f"{name} is also given by {given_by[name]}; give it in one evidence file only")
            else:
                combined[name], given_by[name] = value, path
    return Evidence(**combined)


PERF_EVIDENCE_SCHEMA_ID = "https://gatekeeper.invalid/schemas/perf_evidence.v1.json"


def perf_evidence_json_schema() -> dict[str, Any]:
    """The JSON Schema of `PerfEvidence` (schema_version 1), as committed in schemas/perf_evidence.v1.json."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": PERF_EVIDENCE_SCHEMA_ID,
            **PerfEvidence.model_json_schema()}


def parse_evidence(text: str | bytes, source: str) -> Evidence:
    """Parse an evidence JSON document (what `gatekeeper collect` writes). Errors name the source and field."""
    return _parse(Evidence, text, source, MAX_EVIDENCE_BYTES)


def load_evidence(path: str | Path) -> Evidence:
    """Read and parse an evidence file; `gatekeeper check --evidence` uses this."""
    return parse_evidence(_read_capped(Path(path), MAX_EVIDENCE_BYTES), str(path))


def parse_perf_evidence(text: str | bytes, source: str) -> PerfEvidence:
    """Parse one PerfEvidence JSON document (a bench output, a PR file, a fenced block of the PR body)."""
    return _parse(PerfEvidence, text, source, MAX_PERF_BYTES)


def load_perf_evidence(path: str | Path) -> PerfEvidence:
    return parse_perf_evidence(_read_capped(Path(path), MAX_PERF_BYTES), str(path))


def _read_capped(path: Path, limit: int) -> bytes:
    try:
        size = path.stat().st_size
        if size > limit:
            raise InputError(str(path), f"file is {size} bytes, more than the {limit}-byte limit for evidence")
        return path.read_bytes()
    except OSError as exc:
        raise InputError(str(path), f"cannot read evidence: {exc.strerror or exc}") from None


def _parse(model: type[_Strict], text: str | bytes, source: str, limit: int):
    raw = text.encode() if isinstance(text, str) else text
    if len(raw) > limit:
        raise InputError(source, f"evidence is {len(raw)} bytes, more than the {limit}-byte limit")
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise InputError(source, "evidence is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise InputError(source, f"invalid JSON: {exc.msg} (column {exc.colno})", exc.lineno) from None
    except ValueError as exc:  # NaN / Infinity, refused by _reject_constant
        raise InputError(source, str(exc)) from None
    except RecursionError:
        raise InputError(source, "JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise InputError(source, f"evidence must be a JSON object, not {type(data).__name__}", 1)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(top level)"
        extra = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise InputError(source, f"{field}: {first['msg']}{extra}") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number evidence may contain")
