"""The decode executor inside vLLM's Kimi K3 forward, at the hook vLLM 0.33 uses for its own latency_specialized decode.

vLLM's `KimiLinearForCausalLM.forward` asks `self.specialized_decode.plan(positions, intermediate_tensors)`; a plan
runs `specialized_decode.run(plan, input_ids, inputs_embeds)`, None runs the stock backbone (`self.model`). vLLM
installs its own `SpecializedDecode` there (SM100, CuTe kernels, FULL CUDA graphs only). For an admitted deployment
the plugin installs a `PathDecode` there instead, built once the weights are loaded (`vllm_model`):

- `plan` counts one decision per step: a pure decode batch inside the support matrix runs the specialized path;
  prefill, mixed and oversized batches, pipeline-stage inputs, steps without attention metadata (profiling, warmup)
  and CUDA-graph captures run the stock forward;
- `run` computes the whole step from the re-laid-out weights (`vllm_weights`): layer 0 (KDA + dense MLP), every
  other layer through `executor.DecodeExecutor` (the CuTe MoE kernels where they run, the fp32 reference ops
  otherwise), the final AttnRes mix; it reads each KDA layer's conv/recurrent state and each MLA layer's latent
  cache from vLLM's caches and writes the updated state and the decoded rows back. At TP > 1 the attention and MLP
  outputs are all-reduced (the reference ops compute one rank's partial sums).

It returns pre-norm hidden states, as the stock forward does, so `compute_logits` applies the final norm to both.
Imports vllm only inside functions; the caller passes vLLM's all-reduce and KV-state layout.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kimi_k3_path.config import KimiK3Config, shard_shapes
from kimi_k3_path.executor import SPECIALIZED, ComposedPath, Decision, DecodeOps, StepBatch, build_executor
from kimi_k3_path.reference import (
    KdaDenseLayerWeights,
    KdaMoeLayerWeights,
    KdaState,
    LayerPosition,
    PagedLatentCache,
    ResidualStream,
    attn_res_mix,
    dense_mlp,
)
from kimi_k3_path.reference.dims import layer_dims
from kimi_k3_path.reference.layers import pre_attention, pre_mlp
from kimi_k3_path.support import SUPPORT_MATRIX, Deployment, SupportMatrix
from kimi_k3_path.vllm_weights import model_weights

STOCK = "vllm-stock"


class VllmStockLayers:
    """The executor's stock path inside vLLM: vLLM's own forward runs stock steps (`plan` returns None), so the
    executor never computes one; reaching this is a routing bug, and says so instead of computing something else."""

    name = STOCK

    def kda_moe(self, *args: Any) -> tuple:
        raise RuntimeError("a planned step reached the stock path: plan() and the executor disagree")

    mla_moe = kda_moe


def reduced(ops: DecodeOps, all_reduce: Callable[[Any], Any]) -> DecodeOps:
    """`ops` with their outputs all-reduced over the TP group (a rank's attention and MoE outputs are partial)."""

    def kda_step(x, w, state, d):
        out, state = ops.kda_step(x, w, state, d)
        return all_reduce(out), state

    def mla_decode(x, w, cache, d):
        out, cache = ops.mla_decode(x, w, cache, d)
        return all_reduce(out), cache

    return DecodeOps(name=ops.name, kda_step=kda_step, mla_decode=mla_decode,
                     latent_moe=lambda x, w, d: all_reduce(ops.latent_moe(x, w, d)))


@dataclass(frozen=True)
class Plan:
    batch: StepBatch
    metadata: dict[str, Any]  # the forward context's attention metadata, by layer name


def layer_name(module: Any) -> str:
    """The key of a layer's attention metadata (vLLM's `layer_name` in its specialized decode)."""
    return getattr(module, "prefix", getattr(module, "layer_name", None))


def step_batch(mla_metadata: Any) -> StepBatch:
    """The step's batch from an MLA layer's metadata (vLLM orders decode requests first). Decode rows bring one
    token after seq_len - 1 cached ones; prefill rows are counted with context 0, which classifies them as prefill
    whatever their cached prefix (a prefill row is not a decode row either way)."""
    md = mla_metadata
    bounds = md.query_start_loc[: md.num_reqs + 1].tolist()
    query_lens = [b - a for a, b in zip(bounds, bounds[1:])]
    decode_seq_lens = md.decode.seq_lens[: md.num_decodes].tolist() if md.num_decodes else []
    context = [s - q for s, q in zip(decode_seq_lens, query_lens)] + [0] * (md.num_reqs - md.num_decodes)
    return StepBatch(query_lens=tuple(query_lens), context_lens=tuple(context))


class PathDecode:
    """vLLM's `specialized_decode` slot for an admitted deployment (see the module docstring)."""

    def __init__(
        self, backbone: Any, deployment: Deployment, config: KimiK3Config, *, device: Any,
        conv_state_dim_first: bool, all_reduce: Callable[[Any], Any] | None = None,
        matrix: SupportMatrix = SUPPORT_MATRIX,
    ):
        self.backbone = backbone
        self.layers = tuple(backbone.layers[backbone.start_layer : backbone.end_layer])
        self.dims = layer_dims(config, deployment.tp)
        # Re-laid out once, from the parameters as loaded (before the MoE backend repacks its experts).
        self.weights = model_weights(backbone, self.dims, shard_shapes(config, deployment.tp).dense_intermediate)
        self.executor = build_executor(deployment, str(device), matrix, stock=VllmStockLayers())
        self.reduce = all_reduce or (lambda t: t)
        if all_reduce is not None:
            self.executor.specialized = ComposedPath(reduced(self.executor.specialized.ops, all_reduce))
        self.ops = self.executor.specialized.ops
        self.conv_state_dim_first = conv_state_dim_first
        self.mla_layer = next((layer_name(d.self_attn) for d in self.layers if not hasattr(d.self_attn, "in_proj_qkvgfab")), None)
        if self.mla_layer is None:
            raise ValueError("the backbone has no MLA layer, whose metadata describes the step's batch")
        self.steps: Counter[Decision] = Counter()

    # --- the hook's interface (vLLM's KimiLinearForCausalLM calls these) -----------------------------------------

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.backbone.embed_input_ids(input_ids)

    def plan(self, positions: torch.Tensor, intermediate_tensors: Any) -> Plan | None:
        """This step's plan, or None for the stock forward; every decision is counted (`summary`)."""
        decision, plan = self._decide(positions, intermediate_tensors)
        self.steps[decision] += 1
        return plan

    def run(self, plan: Plan, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None) -> torch.Tensor:
        """The step's hidden states before the final norm, [tokens, hidden] in the model's dtype."""
        x = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        b, hidden = x.shape
        stream = ResidualStream(
            blocks=torch.zeros(b, self.backbone.num_attn_res_blocks, hidden, device=x.device),
            prefix=x.float(),  # vLLM starts the stream with the embeddings as the prefix and no delta
        )
        delta = torch.zeros(b, hidden, device=x.device)
        for layer, w in zip(self.layers, self.weights.layers):
            md = plan.metadata[layer_name(layer.self_attn)]
            pos = LayerPosition(layer.layer_idx, self.dims.attn_res_block)
            if isinstance(w, KdaDenseLayerWeights):
                delta, stream = self._dense_layer(layer.self_attn, md, delta, stream, w, pos)
            elif isinstance(w, KdaMoeLayerWeights):
                state = self.read_kda_state(layer.self_attn, md, b)
                delta, stream, state = self.executor.kda_moe(plan.batch, delta, stream, w, state, pos, self.dims)
                self.write_kda_state(layer.self_attn, md, state)
            else:
                cache = self.latent_cache(layer.self_attn, md, b)
                delta, stream, cache = self.executor.mla_moe(plan.batch, delta, stream, w, cache, pos, self.dims)
                self.write_latent_rows(layer.self_attn, cache)
        final = attn_res_mix(stream.blocks[:, : self.backbone.num_attn_res_blocks], stream.prefix + delta,
                             self.weights.final, self.dims.moe.eps, 0.0)
        return final.to(x.dtype)

    def summary(self) -> dict[str, int]:
        """Steps per 'path: reason' (the executor's `summary` counts the layers of the specialized steps)."""
        return {f"{d.path}: {d.reason}": n for d, n in sorted(self.steps.items(), key=lambda kv: -kv[1])}

    # --- routing ------------------------------------------------------------------------------------------------

    def _decide(self, positions: torch.Tensor, intermediate_tensors: Any) -> tuple[Decision, Plan | None]:
        if intermediate_tensors is not None:
            return Decision(STOCK, "pipeline-stage input"), None
        metadata = _attention_metadata()
        if not isinstance(metadata, dict) or self.mla_layer not in metadata:
            return Decision(STOCK, "no attention metadata (profiling or warmup run)"), None
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            # The reference ops synchronize with the host; a captured graph would replay the stock step.
            return Decision(STOCK, "CUDA graph capture"), None
        batch = step_batch(metadata[self.mla_layer])
        if batch.num_seqs != positions.shape[0] and batch.kind() == "decode":
            return Decision(STOCK, f"{positions.shape[0]} tokens for {batch.num_seqs} decode requests (padded)"), None
        decision = self.executor.decide(batch)
        return decision, Plan(batch, metadata) if decision.path == SPECIALIZED else None

    # --- layer 0 and vLLM's state layouts -----------------------------------------------------------------------

    def _dense_layer(self, attn, md, delta, stream, w: KdaDenseLayerWeights, pos):
        """Layer 0 with this path's KDA op (`reference.kda_dense_layer` is its oracle, without the all-reduce)."""
        state = self.read_kda_state(attn, md, delta.shape[0])
        h, stream = pre_attention(delta, stream, w.norms, pos)
        attn_out, state = self.ops.kda_step(h, w.kda, state, self.dims.kda)
        self.write_kda_state(attn, md, state)
        h, stream = pre_mlp(attn_out, stream, w.norms, pos)
        return self.reduce(dense_mlp(h, w.mlp)), stream

    def _kda_slots(self, attn: Any, md: Any, b: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        conv, recurrent = attn.kv_cache[:2]
        slots = md.non_spec_state_indices_tensor[: md.num_decodes if b is None else b].long()
        return conv, recurrent, slots

    def read_kda_state(self, attn: Any, md: Any, b: int) -> KdaState:
        """The decoding requests' KDA state: conv [b, 3*proj, W-1] oldest first, recurrent [b, heads, D_v, D_k]
        (vLLM's [slot, H, V, K]). vLLM stores the conv state (dim, W-1) or (W-1, dim) per slot."""
        conv, recurrent, slots = self._kda_slots(attn, md, b)
        window = conv[slots]
        return KdaState(conv=window if self.conv_state_dim_first else window.transpose(1, 2), recurrent=recurrent[slots])

    def write_kda_state(self, attn: Any, md: Any, state: KdaState) -> None:
        conv, recurrent, slots = self._kda_slots(attn, md, state.conv.shape[0])
        window = state.conv if self.conv_state_dim_first else state.conv.transpose(1, 2)
        conv[slots] = window.to(conv.dtype)
        recurrent[slots] = state.recurrent.to(recurrent.dtype)

    def latent_cache(self, attn: Any, md: Any, b: int) -> PagedLatentCache:
        """vLLM's MLA cache [blocks, block_size, kv_lora + rope] with the decode block table and sequence lengths
        (which count the token being decoded, as the reference's do)."""
        return PagedLatentCache(pages=attn.kv_cache, block_table=md.decode.block_table[:b],
                                seq_lens=md.decode.seq_lens[:b])

    def write_latent_rows(self, attn: Any, cache: PagedLatentCache) -> None:
        """Copy each request's decoded row (at seq_len - 1) into vLLM's cache."""
        for i in range(cache.seq_lens.shape[0]):
            page, offset = cache.slot(i, int(cache.seq_lens[i]) - 1)
            attn.kv_cache[page, offset] = cache.pages[page, offset].to(attn.kv_cache.dtype)


def _attention_metadata() -> Any:
    from vllm.forward_context import get_forward_context, is_forward_context_available

    return get_forward_context().attn_metadata if is_forward_context_available() else None
