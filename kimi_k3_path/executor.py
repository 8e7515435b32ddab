"""Per-step dispatch between the latency-specialized decode path and the stock path.

A pure-decode batch (every sequence has context and brings exactly one new token) of a deployment inside the
support matrix, no larger than its decode-batch bound and no sequence longer than its context bound, runs the
specialized path; prefill, mixed batches, oversized batches, over-long contexts and deployments the guard rejects
run the stock path. Both paths take the same arguments and
return the same outputs, so the caller cannot tell them apart except by speed; every decision is counted by its
reason, so a fallback is never silent.

A path computes one decode layer of one tensor-parallel rank with the signatures of
`kimi_k3_path.reference.kda_moe_layer` / `mla_moe_layer`. The specialized path composes the layer from
per-op implementations (`DecodeOps`): a kernel where one exists for this device, the fp32 reference op otherwise.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from kimi_k3_path.guard import UnsupportedDeployment, check_deployment, unsupported_fields
from kimi_k3_path.reference import (
    KdaState,
    PagedLatentCache,
    kda_decode_step,
    kda_moe_layer,
    latent_moe,
    mla_decode,
    mla_moe_layer,
)
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


class PerWeights:
    """Device copies made once per weights object: converting a layer's weights every step would dominate."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[Any, Any]] = {}

    def get(self, weights: Any, convert: Callable[[], Any]) -> Any:
        held = self._held.get(id(weights))
        if held is None or held[0] is not weights:  # an id can be reused once its object is gone
            held = self._held[id(weights)] = (weights, convert())
        return held[1]


def to_act(t: Any, device: str) -> Any:
    return t.to(device=device, dtype=torch.bfloat16).contiguous()


def back_to(like: Any) -> Callable[[Any], Any]:
    """Converts a result to fp32 on the device of the caller's tensor `like`."""
    return lambda t: t.to(device=like.device, dtype=torch.float32)


class KernelOp:
    """What the kernel ops share: the kernel module `kimi_k3_path.kernels.<MODULE>` (or an injected stand-in with its
    interface), the device the kernels run on, their weights prepared once per reference weights object."""

    MODULE = ""

    def __init__(self, device: str = "cuda", kernels: Any = None):
        self.kernels = kernels if kernels is not None else importlib.import_module(f"kimi_k3_path.kernels.{self.MODULE}")
        self.device = device
        self._prepared = PerWeights()

    def stream(self) -> Any:
        """The stream the kernels launch on: the current CUDA stream, None off CUDA (a stand-in's device)."""
        return torch.cuda.current_stream() if str(self.device).startswith("cuda") else None


class KernelLatentMoe(KernelOp):
    """`latent_moe` on the CuTe DSL kernels (`kimi_k3_path.kernels.moe.latent_moe_decode`, sm_90a, decode batches
    of 1..64): the input goes to `device` in bf16, the output comes back in fp32 on the caller's device. Kernel
    weights and workspace are prepared once per MoeWeights object."""

    MODULE = "moe"

    def __call__(self, x: Any, w: Any, d: Any) -> Any:
        def prepare() -> tuple:
            kernel_weights = self.kernels.prepare_weights(w, d.top_k, d.routed_scaling_factor, d.eps, self.device)
            return kernel_weights, self.kernels.MoeWorkspace(kernel_weights, self.device)

        kernel_weights, workspace = self._prepared.get(w, prepare)
        out = torch.empty(x.shape[0], d.hidden, device=self.device, dtype=torch.bfloat16)
        self.kernels.latent_moe_decode(to_act(x, self.device), kernel_weights, workspace, out, self.stream())
        return back_to(x)(out)


class KernelKdaStep(KernelOp):
    """`kda_decode_step` on the CuTe DSL kernels (`kimi_k3_path.kernels.kda.kda_attention_decode`, sm_90a, decode
    batches of 1..64): the reference signature (pure: a new KdaState out) over the kernels' in-place, slot-addressed
    state, by copying the batch's state into a pool of its own (slot i for sequence i) and back."""

    MODULE = "kda"

    def __call__(self, x: Any, w: Any, state: KdaState, d: Any) -> tuple[Any, KdaState]:
        weights = self._prepared.get(w, lambda: self.kernels.prepare_attention_weights(w, d, self.device))
        m = x.shape[0]
        conv = state.conv.to(device=self.device, dtype=torch.bfloat16, copy=True).contiguous()
        recurrent = state.recurrent.to(device=self.device, dtype=torch.float32, copy=True).contiguous()
        slots = torch.arange(m, device=self.device, dtype=torch.int32)
        out = torch.empty(m, d.hidden, device=self.device, dtype=torch.bfloat16)
        self.kernels.kda_attention_decode(to_act(x, self.device), weights, slots, conv, recurrent, out, self.stream())
        back = back_to(x)
        return back(out), KdaState(conv=back(conv), recurrent=back(recurrent))


class KernelMlaDecode(KernelOp):
    """`mla_decode` on the CuTe DSL kernels (`kimi_k3_path.kernels.mla.mla_decode`, sm_90a, decode batches of 1..64):
    the reference signature (pure: a new PagedLatentCache with the decoded rows out) over the kernels' in-place paged
    cache, by copying the pages to `device` in bf16 and back (fp32, on the caller's device); the slots are the rows
    of each sequence's token at position seq_len - 1 (vLLM's slot mapping)."""

    MODULE = "mla"

    def __call__(self, x: Any, w: Any, cache: PagedLatentCache, d: Any) -> tuple[Any, PagedLatentCache]:
        weights = self._prepared.get(w, lambda: self.kernels.prepare_mla_weights(w, d, self.device))
        page = cache.pages.shape[1]
        last = cache.seq_lens.long() - 1
        slots = cache.block_table.long().gather(1, (last // page)[:, None])[:, 0] * page + last % page
        pages = cache.pages.to(device=self.device, dtype=torch.bfloat16, copy=True).contiguous()
        out = torch.empty(x.shape[0], d.hidden, device=self.device, dtype=torch.bfloat16)
        self.kernels.mla_decode(
            to_act(x, self.device), weights, pages,
            cache.block_table.to(device=self.device, dtype=torch.int32).contiguous(),
            cache.seq_lens.to(device=self.device, dtype=torch.int32).contiguous(), slots.to(self.device), out, self.stream(),
            None,
        )
        back = back_to(x)
        return back(out), PagedLatentCache(pages=back(pages), block_table=cache.block_table, seq_lens=cache.seq_lens)


def reference_ops() -> DecodeOps:
    """The fp32 reference ops: what the specialized path runs for an op family without a kernel."""
    return DecodeOps(name="reference", kda_step=kda_decode_step, mla_decode=mla_decode, latent_moe=latent_moe)


def kernel_ops(device: str = "cuda", moe_kernels: Any = None, kda_kernels: Any = None,
               mla_kernels: Any = None) -> DecodeOps:
    """The CuTe DSL kernels for every op family: the latent MoE, KDA attention, MLA attention."""
    return DecodeOps(
        name="cute", kda_step=KernelKdaStep(device, kda_kernels), mla_decode=KernelMlaDecode(device, mla_kernels),
        latent_moe=KernelLatentMoe(device, moe_kernels),
    )


def kernels_unavailable(device: str) -> str | None:
    """Why the kernels cannot run on `device`, or None when they can (an sm_90 GPU and an importable module)."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return f"{device} is not a CUDA device"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        return f"the kernels are built for sm_90a, this GPU is sm_{major}{minor}"
    try:
        from kimi_k3_path.kernels import kda, mla, moe  # noqa: F401
    except ImportError as error:
        return f"the kernels do not import: {error}"
    return None


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
        # The perf rows measure a step at `context` tokens already cached (the step's own token on top), so the
        # bound applies to the cached tokens. vLLM never forms such a step for an admitted deployment (a sequence
        # holds at most max_model_len - 1 cached tokens when it decodes); like the batch bound, this is the backstop.
        bound = min(self.deployment.max_context, self.matrix.max_context)
        longest = max(batch.context_lens)
        if longest > bound:
            return Decision(self.stock.name, f"context of {longest} cached tokens exceeds max_context {bound}")
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


def build_executor(
    deployment: Deployment, device: str = "cpu", matrix: SupportMatrix = SUPPORT_MATRIX,
    stock: LayerPath | None = None,
) -> DecodeExecutor:
    """The executor for `device`. Specialized: the kernel ops where the kernels run (`kernels_unavailable`), else
    the reference ops (the path's name says which). Stock: what the caller runs outside the specialized path (in
    vLLM its own layers; the bench and the tests pass the stock-like sequence, benchmarks/kimi_k3/stock_layers.py),
    by default the fp32 reference layers. Kernels are built only for a deployment the guard admits."""
    admitted = not unsupported_fields(deployment, matrix)
    ops = kernel_ops(device) if admitted and kernels_unavailable(device) is None else reference_ops()
    return DecodeExecutor(deployment, ComposedPath(ops), stock or ReferenceLayers(), matrix)
