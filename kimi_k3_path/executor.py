"""Per-step dispatch between the latency-specialized decode path and the stock path.

A pure-decode batch (every sequence has context and brings exactly one new token) of a deployment inside the
support matrix, no larger than its decode-batch bound, runs the specialized path; prefill, mixed batches,
oversized batches and deployments the guard rejects run the stock path. Both paths take the same arguments and
return the same outputs, so the caller cannot tell them apart except by speed; every decision is counted by its
reason, so a fallback is never silent.

A path computes one decode layer of one tensor-parallel rank with the signatures of
`kimi_k3_path.reference.kda_moe_layer` / `mla_moe_layer`. The specialized path composes the layer from
per-op implementations (`DecodeOps`): a kernel where one exists for this device, the fp32 reference op otherwise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kimi_k3_path.guard import UnsupportedDeployment, check_deployment
from kimi_k3_path.reference import kda_decode_step, kda_moe_layer, latent_moe, mla_decode, mla_moe_layer
from kimi_k3_path.reference.layers import pre_attention, pre_mlp
from kimi_k3_path.support import SUPPORT_MATRIX, Deployment, SupportMatrix

SPECIALIZED = "specialized"


@dataclass(frozen=True)
class StepBatch:
    """What the scheduler hands one forward step: per sequence, the tokens already in its cache
    (`context_lens`) and the tokens it brings this step (`query_lens`)."""

    query_lens: tuple[int, ...]
    context_lens: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.query_lens:
            raise ValueError("StepBatch: a step needs at least one sequence")
        if len(self.query_lens) != len(self.context_lens):
            raise ValueError(
                f"StepBatch: {len(self.query_lens)} query_lens but {len(self.context_lens)} context_lens"
            )
        if min(self.query_lens) < 1 or min(self.context_lens) < 0:
            raise ValueError("StepBatch: query_lens must be >= 1 and context_lens >= 0")

    @classmethod
    def decode(cls, context_lens: tuple[int, ...] | list[int]) -> StepBatch:
        return cls(query_lens=(1,) * len(context_lens), context_lens=tuple(context_lens))

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    def decoding(self, tokens_per_step: int = 1) -> tuple[bool, ...]:
        """Per sequence: is it decoding (has context, brings `tokens_per_step` tokens)? The rest are prefilling
        (a first chunk or a later chunk of a chunked prefill)."""
        return tuple(c > 0 and q == tokens_per_step for q, c in zip(self.query_lens, self.context_lens))

    def kind(self, tokens_per_step: int = 1) -> str:
        """'decode', 'prefill' or 'mixed'."""
        decoding = self.decoding(tokens_per_step)
        return "decode" if all(decoding) else "prefill" if not any(decoding) else "mixed"


class LayerPath(Protocol):
    """One way to compute a decode layer of one rank; both methods are pure (new state out, inputs untouched)."""

    name: str

    def kda_moe(self, delta: Any, stream: Any, weights: Any, state: Any, pos: Any, dims: Any) -> tuple:
        """-> (layer output, updated residual stream, updated KDA state)"""

    def mla_moe(self, delta: Any, stream: Any, weights: Any, cache: Any, pos: Any, dims: Any) -> tuple:
        """-> (layer output, updated residual stream, cache with the decoded rows)"""


@dataclass(frozen=True)
class DecodeOps:
    """The op implementations a decode layer is composed of, each with its reference op's signature."""

    name: str
    kda_step: Callable[..., tuple]  # (x, KdaWeights, KdaState, KdaDims) -> (out, KdaState)
    mla_decode: Callable[..., tuple]  # (x, MlaWeights, PagedLatentCache, MlaDims) -> (out, PagedLatentCache)
    latent_moe: Callable[..., Any]  # (x, MoeWeights, MoeDims) -> out


class ComposedPath:
    """A decode layer composed from `ops`: AttnRes mix, attention op, AttnRes mix, MoE op. The residual-stream
    bookkeeping is the reference's own (`reference.layers.pre_attention` / `pre_mlp`), so only the ops differ."""

    def __init__(self, ops: DecodeOps):
        self.ops = ops
        self.name = f"{SPECIALIZED}[{ops.name}]"

    def kda_moe(self, delta, stream, weights, state, pos, dims):
        h, stream = pre_attention(delta, stream, weights.norms, pos)
        attn_out, state = self.ops.kda_step(h, weights.kda, state, dims.kda)
        h, stream = pre_mlp(attn_out, stream, weights.norms, pos)
        return self.ops.latent_moe(h, weights.moe, dims.moe), stream, state

    def mla_moe(self, delta, stream, weights, cache, pos, dims):
        h, stream = pre_attention(delta, stream, weights.norms, pos)
        attn_out, cache = self.ops.mla_decode(h, weights.mla, cache, dims.mla)
        h, stream = pre_mlp(attn_out, stream, weights.norms, pos)
        return self.ops.latent_moe(h, weights.moe, dims.moe), stream, cache


class ReferenceLayers:
    """The fp32 reference layers (`reference.kda_moe_layer` / `mla_moe_layer`): the stock path where the GPU
    stock-like sequence cannot run (CPU), and the oracle the other paths are compared with."""

    name = "reference"

    def kda_moe(self, delta, stream, weights, state, pos, dims):
        return kda_moe_layer(delta, stream, weights, state, pos, dims.kda, dims.moe)

    def mla_moe(self, delta, stream, weights, cache, pos, dims):
        return mla_moe_layer(delta, stream, weights, cache, pos, dims.mla, dims.moe)


def reference_ops() -> DecodeOps:
    """The fp32 reference ops: what the specialized path runs for an op family without a kernel."""
    return DecodeOps(name="reference", kda_step=kda_decode_step, mla_decode=mla_decode, latent_moe=latent_moe)


@dataclass(frozen=True)
class Decision:
    path: str  # SPECIALIZED or the stock path's name
    reason: str


class DecodeExecutor:
    """Runs each layer of a step on the specialized path when the deployment and the batch allow it, else stock.

    The guard runs once, at construction; a rejected deployment is kept (not raised: the vLLM plugin already
    refuses to start one that asked for the specialized path) and sends every step to the stock path."""

    def __init__(
        self,
        deployment: Deployment,
        specialized: LayerPath,
        stock: LayerPath,
        matrix: SupportMatrix = SUPPORT_MATRIX,
    ):
        try:
            check_deployment(deployment, matrix)
            self.rejection: UnsupportedDeployment | None = None
        except UnsupportedDeployment as error:
            self.rejection = error
        self.deployment = deployment
        self.matrix = matrix
        self.specialized = specialized
        self.stock = stock
        self.decisions: Counter[Decision] = Counter()

    def decide(self, batch: StepBatch) -> Decision:
        """Which path this step takes, and why (pure: counting happens when a layer runs)."""
        if self.rejection is not None:
            return Decision(self.stock.name, f"deployment outside the support matrix ({', '.join(self.rejection.fields)})")
        kind = batch.kind(tokens_per_step=1 + self.deployment.spec_tokens)
        if kind != "decode":
            return Decision(self.stock.name, f"{kind} batch")
        bound = min(self.deployment.max_batch, self.matrix.max_batch)
        if batch.num_seqs > bound:
            return Decision(self.stock.name, f"decode batch of {batch.num_seqs} exceeds max_batch {bound}")
        return Decision(SPECIALIZED, "decode batch inside the support matrix")

    def _route(self, batch: StepBatch, delta: Any) -> LayerPath:
        rows = getattr(delta, "shape", (None,))[0]
        tokens = sum(batch.query_lens)
        if rows != tokens:
            raise ValueError(f"the layer input has {rows} rows but the batch brings {tokens} tokens")
        decision = self.decide(batch)
        self.decisions[decision] += 1
        return self.specialized if decision.path == SPECIALIZED else self.stock

    def kda_moe(self, batch: StepBatch, delta, stream, weights, state, pos, dims) -> tuple:
        return self._route(batch, delta).kda_moe(delta, stream, weights, state, pos, dims)

    def mla_moe(self, batch: StepBatch, delta, stream, weights, cache, pos, dims) -> tuple:
        return self._route(batch, delta).mla_moe(delta, stream, weights, cache, pos, dims)

    def summary(self) -> dict[str, int]:
        """Steps per 'path: reason', for logs and the bench report."""
        return {f"{d.path}: {d.reason}": n for d, n in sorted(self.decisions.items(), key=lambda kv: -kv[1])}


def build_executor(deployment: Deployment, matrix: SupportMatrix = SUPPORT_MATRIX) -> DecodeExecutor:
    """The executor with this machine's paths: specialized = reference ops composed (kernels plug in per op
    family through `DecodeOps` as they land); stock = the reference layers."""
    return DecodeExecutor(deployment, ComposedPath(reference_ops()), ReferenceLayers(), matrix)
