"""The startup guard: `check_deployment(d)` admits a Deployment inside `SUPPORT_MATRIX` and rejects the rest.

A rejection names every unsupported field at once, with the supported values, so one failed start tells the
operator everything to change. Pure: no torch, no vllm, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimi_k3_path.support import BOUNDS, SUPPORT_MATRIX, Deployment, SupportMatrix

_HOW_TO_OPT_OUT = (
    "Supported deployments are listed in kimi_k3_path/README.md; "
    "use the 'auto' decode backend to serve this deployment with the stock decode path."
)


@dataclass(frozen=True)
class Unsupported:
    """One Deployment field whose value the support matrix does not admit."""

    field: str
    value: Any
    supported: str  # the admitted values, as the operator would type them
    reason: str = ""  # why, where there is more to say than "not implemented"

    def describe(self) -> str:
        why = f": {self.reason}" if self.reason else ""
        return f"{self.field}={self.value!r}{why} (supported: {self.supported})"


class UnsupportedDeployment(ValueError):
    """The specialized decode path was requested for a deployment outside the support matrix."""

    def __init__(self, deployment: Deployment, problems: tuple[Unsupported, ...]):
        if not problems:
            raise ValueError("UnsupportedDeployment needs at least one unsupported field")
        self.deployment = deployment
        self.problems = problems
        lines = "\n".join(f"  - {problem.describe()}" for problem in problems)
        super().__init__(
            "Kimi K3 latency-specialized decode does not support this deployment "
            f"({', '.join(problem.field for problem in problems)}):\n{lines}\n{_HOW_TO_OPT_OUT}"
        )

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(problem.field for problem in self.problems)


def unsupported_fields(d: Deployment, matrix: SupportMatrix = SUPPORT_MATRIX) -> tuple[Unsupported, ...]:
    """Every field of `d` outside `matrix`, in Deployment field order; empty when `d` is admitted."""
    problems: list[Unsupported] = []
    for field in Deployment.model_fields:
        value = getattr(d, field)
        if field in BOUNDS:
            if value > getattr(matrix, field):
                problems.append(Unsupported(field, value, matrix.supported_text(field), BOUNDS[field].beyond))
        elif value not in matrix.admitted(field):
            reason = matrix.unvalidated_arch.get(value, "") if field == "arch" else ""
            problems.append(Unsupported(field, value, matrix.supported_text(field), reason))
    return tuple(problems)


def check_deployment(d: Deployment, matrix: SupportMatrix = SUPPORT_MATRIX) -> None:
    """Return None if the specialized decode path supports `d`; otherwise raise UnsupportedDeployment naming
    every unsupported field with its supported values."""
    if not isinstance(d, Deployment):
        raise TypeError(f"check_deployment takes a kimi_k3_path.support.Deployment, got {type(d).__name__}")
    problems = unsupported_fields(d, matrix)
    if problems:
        raise UnsupportedDeployment(d, problems)
