"""What the latency-specialized Kimi K3 decode path supports: one object, declared in code.

`SUPPORT_MATRIX` is the single source of truth. The startup guard (`kimi_k3_path.guard`) admits exactly what it
declares, the tests enumerate it, and the perf-matrix evidence must cover `SUPPORT_MATRIX.perf_axes()`. Widen it only
in the same change that lands the kernels and the H200 evidence for the new values.

This module imports neither torch nor vllm: the gatekeeper loads it in its static checks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# NVIDIA compute capabilities, or the platform name where there is no CUDA capability to report.
_ARCH = re.compile(r"^(sm_[0-9]{2,3}[a-z]?|cpu|rocm|xpu|tpu|unknown)$")


def _spelled(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return "/".join(str(part) for part in value)
    return str(value)


def spec_label(method: str | None, tokens: int) -> str:
    """The perf-matrix `spec` axis value: 'none', or 'method:tokens' (e.g. 'dspark:3')."""
    return "none" if method is None else f"{method}:{tokens}"


class Deployment(BaseModel):
    """One way of serving Kimi K3: the settings that decide whether the specialized decode path may run.

    `max_batch` is the largest decode batch the engine will form (vLLM: `max_num_seqs`); `max_context` the
    longest sequence it admits, prompt + generated tokens (vLLM: `max_model_len`); `kv_dtype` is the MLA latent
    KV-cache dtype; `kda_state_dtypes` are the KDA (conv, recurrent) state dtypes.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    arch: str = Field(description="GPU architecture, e.g. sm_90 (H100/H200), sm_100 (B200/GB200); or the platform")
    tp: int = Field(ge=1, description="tensor-parallel size")
    dcp: int = Field(default=1, ge=1, description="decode-context-parallel size")
    max_batch: int = Field(ge=1, description="largest decode batch (sequences per step)")
    max_context: int = Field(
        ge=1, description="longest sequence the engine admits, prompt + generated tokens (vLLM: max_model_len)"
    )
    spec_method: str | None = Field(default=None, description="speculative decoding method; None: off")
    spec_tokens: int = Field(default=0, ge=0, description="draft tokens per step")
    kv_dtype: str = "bfloat16"
    act_dtype: str = "bfloat16"
    expert_quant: str = "mxfp4"
    # Not in the interface; added (with defaults) because each changes the per-rank shapes or state the
    # kernels assume, and vLLM can set each of them independently of the fields above.
    pp: int = Field(default=1, ge=1, description="pipeline-parallel size")
    expert_parallel: bool = False
    kda_state_dtypes: tuple[str, str] = ("bfloat16", "float32")

    @field_validator("arch")
    @classmethod
    def _arch_spelling(cls, value: str) -> str:
        if not _ARCH.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a GPU architecture name such as 'sm_90' (or cpu, rocm, xpu, tpu, unknown)"
            )
        return value

    @field_validator("spec_method")
    @classmethod
    def _spec_method_spelling(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("use None (not an empty string) for no speculative decoding")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Deployment:
        if self.spec_method is None and self.spec_tokens != 0:
            raise ValueError(f"spec_tokens={self.spec_tokens} needs a spec_method")
        if self.spec_method is not None and self.spec_tokens == 0:
            raise ValueError(f"spec_method={self.spec_method!r} needs spec_tokens >= 1")
        if self.tp % self.dcp:
            raise ValueError(f"dcp={self.dcp} must divide tp={self.tp}")
        return self

    @property
    def spec(self) -> str:
        """The perf-matrix label of the speculative setting."""
        return spec_label(self.spec_method, self.spec_tokens)


@dataclass(frozen=True)
class Bound:
    """A Deployment field the support matrix bounds from above (admitted: 1..bound) instead of listing values."""

    measured: str  # the SupportMatrix field of the values the perf evidence must measure; their maximum is the bound
    axis: str  # the perf-matrix axis those values are measured on
    beyond: str  # why the guard refuses a value above the bound


# Deployment field -> its bound. Every other Deployment field is checked by membership (`discrete_fields`).
BOUNDS: dict[str, Bound] = {
    "max_batch": Bound(measured="perf_batches", axis="batch", beyond="larger decode batches are not validated"),
    "max_context": Bound(measured="perf_contexts", axis="context", beyond="longer contexts are not measured"),
}


class SupportMatrix(BaseModel):
    """The deployments the specialized path admits. Each field lists the admitted values of the Deployment
    field of the same name (`max_batch` and `max_context` are upper bounds, see `BOUNDS`); `unvalidated_arch`
    names architectures we know about but have no evidence for, with the reason the guard gives."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arch: tuple[str, ...]
    tp: tuple[int, ...]
    dcp: tuple[int, ...]
    max_batch: int = Field(ge=1)
    max_context: int = Field(ge=1)
    spec_method: tuple[str | None, ...]
    spec_tokens: tuple[int, ...]
    kv_dtype: tuple[str, ...]
    act_dtype: tuple[str, ...]
    expert_quant: tuple[str, ...]
    pp: tuple[int, ...]
    expert_parallel: tuple[bool, ...]
    kda_state_dtypes: tuple[tuple[str, str], ...]
    # The decode batch sizes the perf evidence must measure; their maximum is `max_batch`.
    perf_batches: tuple[int, ...]
    # The contexts (tokens already in each sequence's cache) the perf evidence must measure; their maximum is
    # `max_context`.
    perf_contexts: tuple[int, ...]
    unvalidated_arch: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _perf_values_span_the_bounds(self) -> SupportMatrix:
        for field, bound in BOUNDS.items():
            measured, limit = getattr(self, bound.measured), getattr(self, field)
            if not measured or max(measured) != limit or min(measured) < 1:
                raise ValueError(f"{bound.measured} {measured} must lie in 1..{field} and reach {limit}")
        if set(self.unvalidated_arch) & set(self.arch):
            raise ValueError("an architecture cannot be both admitted and unvalidated")
        return self

    def discrete_fields(self) -> tuple[str, ...]:
        """The Deployment fields checked by membership (every one but the `BOUNDS`)."""
        return tuple(name for name in Deployment.model_fields if name not in BOUNDS)

    def admitted(self, field: str) -> tuple[Any, ...]:
        """The admitted values of one discrete Deployment field."""
        if field not in self.discrete_fields():
            raise KeyError(f"{field!r} is not a discrete Deployment field")
        return getattr(self, field)

    def supported_text(self, field: str) -> str:
        """The admitted values of a Deployment field as an operator would type them (guard messages, README)."""
        if field in BOUNDS:
            return f"1..{getattr(self, field)}"
        return ", ".join(_spelled(value) for value in self.admitted(field))

    def perf_axes(self) -> dict[str, tuple]:
        """The axes the perf-matrix evidence must cover, every combination of them one row (per layer)."""
        return {
            "arch": self.arch,
            "tp": self.tp,
            "dcp": self.dcp,
            "batch": self.perf_batches,
            "spec": tuple(spec_label(method, tokens) for method, tokens in self.spec_settings()),
            "context": self.perf_contexts,
        }

    def spec_settings(self) -> tuple[tuple[str | None, int], ...]:
        """The admitted (spec_method, spec_tokens) pairs: no draft tokens without a method and vice versa."""
        return tuple(
            (method, tokens)
            for method in self.spec_method
            for tokens in self.spec_tokens
            if (method is None) == (tokens == 0)
        )

    def example_deployments(self) -> tuple[Deployment, ...]:
        """One admitted Deployment per (arch, tp, dcp, spec) combination at every bound (the largest batch, the
        longest context): what tests and docs enumerate."""
        bounds = {field: getattr(self, field) for field in BOUNDS}
        return tuple(
            Deployment(
                **bounds,
                arch=arch,
                tp=tp,
                dcp=dcp,
                spec_method=method,
                spec_tokens=tokens,
                kv_dtype=self.kv_dtype[0],
                act_dtype=self.act_dtype[0],
                expert_quant=self.expert_quant[0],
                pp=self.pp[0],
                expert_parallel=self.expert_parallel[0],
                kda_state_dtypes=self.kda_state_dtypes[0],
            )
            for arch in self.arch
            for tp in self.tp
            for dcp in self.dcp
            for method, tokens in self.spec_settings()
            if tp % dcp == 0
        )


_NO_EVIDENCE = "no evidence from that hardware exists yet"

SUPPORT_MATRIX = SupportMatrix(
    # Only the H200 (sm_90) has kernels and measurements. Blackwell has its own vLLM path (tcgen05/TMEM).
    arch=("sm_90",),
    unvalidated_arch={"sm_100": _NO_EVIDENCE, "sm_103": _NO_EVIDENCE},
    # Per-rank shapes the kernels are written for: 12 heads / expert intermediate 384, and 6 / 192.
    tp=(8, 16),
    dcp=(1,),
    # Decode at <= 64 sequences is the latency-bound regime this path targets; larger batches run stock.
    max_batch=64,
    perf_batches=(1, 2, 4, 8, 16, 32, 64),
    # The MLA decode's cost grows with the context; the perf evidence measured the MLA layer at 4096 and 32768 cached
    # tokens (the KDA layers and the MoE block read no cache: the policy needs them at one context), so longer
    # sequences (vLLM's --max-model-len) are refused. Widen with evidence measured at the longer contexts.
    max_context=32768,
    perf_contexts=(4096, 32768),
    # No speculative-decode (multi-token verify) kernels yet.
    spec_method=(None,),
    spec_tokens=(0,),
    kv_dtype=("bfloat16",),
    act_dtype=("bfloat16",),
    expert_quant=("mxfp4",),
    pp=(1,),
    expert_parallel=(False,),
    kda_state_dtypes=(("bfloat16", "float32"),),
)
