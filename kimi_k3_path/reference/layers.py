"""One Kimi K3 decode layer of each kind (KDA + latent MoE, MLA + latent MoE, and the first layer's KDA + dense
MLP), fp32 reference of one TP rank.

The residual stream follows vLLM's `KimiDecoderLayer` with Block AttnRes: the layer receives the previous
layer's output (`delta`), folds it into the current block's prefix sum, mixes the depth sources before the
attention and again before the MoE, and returns its MoE output as the next layer's `delta`. A layer whose index
is a multiple of the block size first snapshots the prefix as a completed block and then starts a new prefix
with its own attention output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .activation import situ_glu_packed
from .attn_res import AttnResWeights, attn_res_mix, random_attn_res_weights
from .kda import KdaDims, KdaState, KdaWeights, kda_decode_step, random_kda_weights
from .mla import MlaDims, MlaWeights, PagedLatentCache, mla_decode, random_mla_weights
from .moe import MoeDims, MoeWeights, latent_moe, random_moe_weights

ATTN_RES_BLOCK = 12


@dataclass(frozen=True)
class LayerPosition:
    """Where a layer sits in the AttnRes block structure (0-based layer index, as in vLLM)."""

    layer: int
    block_size: int = ATTN_RES_BLOCK

    def __post_init__(self) -> None:
        # Layer 0 (the dense layer) is a position too: it writes block 0 and mixes only its own prefix.
        if self.layer < 0:
            raise ValueError(f"LayerPosition: layer {self.layer} is negative")

    @property
    def writes_block(self) -> bool:
        return self.layer % self.block_size == 0

    @property
    def blocks_before_attn(self) -> int:
        return -(-self.layer // self.block_size)

    @property
    def blocks_before_mlp(self) -> int:
        return self.blocks_before_attn + int(self.writes_block)


@dataclass(frozen=True)
class ResidualStream:
    blocks: torch.Tensor  # [M, max_blocks, H] completed block snapshots
    prefix: torch.Tensor  # [M, H] running sum of the current block


@dataclass(frozen=True)
class LayerNorms:
    attn: AttnResWeights  # before the attention (its out_norm is input_layernorm)
    mlp: AttnResWeights  # before the MoE (its out_norm is post_attention_layernorm)
    eps: float = 1e-5


@dataclass(frozen=True)
class KdaMoeLayerWeights:
    norms: LayerNorms
    kda: KdaWeights
    moe: MoeWeights


@dataclass(frozen=True)
class MlaMoeLayerWeights:
    norms: LayerNorms
    mla: MlaWeights
    moe: MoeWeights


@dataclass(frozen=True)
class DenseMlpWeights:
    """The SiTU MLP of the first `first_k_dense_replace` layers (vLLM `KimiMLP`): gate rows then up rows."""

    gate_up: torch.Tensor  # [2*I, H]
    down: torch.Tensor  # [H, I]


@dataclass(frozen=True)
class KdaDenseLayerWeights:
    norms: LayerNorms
    kda: KdaWeights
    mlp: DenseMlpWeights


def dense_mlp(x: torch.Tensor, w: DenseMlpWeights) -> torch.Tensor:
    """x [M, H] -> [M, H] (at TP>1 a partial sum over this rank's intermediate shard)."""
    return situ_glu_packed(x.float() @ w.gate_up.float().T) @ w.down.float().T


def random_layer_norms(hidden: int, gen: torch.Generator) -> LayerNorms:
    return LayerNorms(attn=random_attn_res_weights(hidden, gen), mlp=random_attn_res_weights(hidden, gen))


def random_dense_mlp_weights(hidden: int, intermediate: int, gen: torch.Generator) -> DenseMlpWeights:
    """intermediate: per rank (config.shard_shapes(...).dense_intermediate)."""
    return DenseMlpWeights(
        gate_up=torch.randn(2 * intermediate, hidden, generator=gen, device=gen.device) / hidden**0.5,
        down=torch.randn(hidden, intermediate, generator=gen, device=gen.device) / intermediate**0.5,
    )


def random_kda_moe_layer(kda: KdaDims, moe: MoeDims, gen: torch.Generator) -> KdaMoeLayerWeights:
    return KdaMoeLayerWeights(random_layer_norms(moe.hidden, gen), random_kda_weights(kda, gen), random_moe_weights(moe, gen))


def random_mla_moe_layer(mla: MlaDims, moe: MoeDims, gen: torch.Generator) -> MlaMoeLayerWeights:
    return MlaMoeLayerWeights(random_layer_norms(moe.hidden, gen), random_mla_weights(mla, gen), random_moe_weights(moe, gen))


def random_residual_stream(batch: int, hidden: int, max_blocks: int, gen: torch.Generator) -> ResidualStream:
    return ResidualStream(
        blocks=torch.randn(batch, max_blocks, hidden, generator=gen, device=gen.device), prefix=torch.randn(batch, hidden, generator=gen, device=gen.device)
    )


def pre_attention(delta: torch.Tensor, stream: ResidualStream, norms: LayerNorms, pos: LayerPosition) -> tuple[torch.Tensor, ResidualStream]:
    prefix = stream.prefix.float() + delta.float()
    blocks = stream.blocks.float()
    if pos.writes_block:
        blocks = blocks.clone()
        blocks[:, pos.blocks_before_attn] = prefix
    mixed = attn_res_mix(blocks[:, : pos.blocks_before_attn], prefix, norms.attn, norms.eps, norms.eps)
    return mixed, ResidualStream(blocks=blocks, prefix=prefix)


def pre_mlp(attn_out: torch.Tensor, stream: ResidualStream, norms: LayerNorms, pos: LayerPosition) -> tuple[torch.Tensor, ResidualStream]:
    prefix = attn_out.float() if pos.writes_block else stream.prefix + attn_out.float()
    mixed = attn_res_mix(stream.blocks[:, : pos.blocks_before_mlp], prefix, norms.mlp, norms.eps, norms.eps)
    return mixed, ResidualStream(blocks=stream.blocks, prefix=prefix)


def kda_moe_layer(
    delta: torch.Tensor, stream: ResidualStream, w: KdaMoeLayerWeights, state: KdaState, pos: LayerPosition,
    kda: KdaDims, moe: MoeDims,
) -> tuple[torch.Tensor, ResidualStream, KdaState]:
    """-> (this layer's output, the next layer's delta; the updated stream; the updated KDA state). Pure."""
    h, stream = pre_attention(delta, stream, w.norms, pos)
    attn_out, state = kda_decode_step(h, w.kda, state, kda)
    h, stream = pre_mlp(attn_out, stream, w.norms, pos)
    return latent_moe(h, w.moe, moe), stream, state


def kda_dense_layer(
    delta: torch.Tensor, stream: ResidualStream, w: KdaDenseLayerWeights, state: KdaState, pos: LayerPosition,
    kda: KdaDims,
) -> tuple[torch.Tensor, ResidualStream, KdaState]:
    """The first layer (KDA + dense MLP). vLLM starts the stream with the token embeddings as the prefix and no
    delta: pass `stream.prefix` = embeddings and `delta` = zeros. Pure."""
    h, stream = pre_attention(delta, stream, w.norms, pos)
    attn_out, state = kda_decode_step(h, w.kda, state, kda)
    h, stream = pre_mlp(attn_out, stream, w.norms, pos)
    return dense_mlp(h, w.mlp), stream, state


def mla_moe_layer(
    delta: torch.Tensor, stream: ResidualStream, w: MlaMoeLayerWeights, cache: PagedLatentCache, pos: LayerPosition,
    mla: MlaDims, moe: MoeDims,
) -> tuple[torch.Tensor, ResidualStream, PagedLatentCache]:
    """-> (this layer's output; the updated stream; the cache with the decoded rows). Pure."""
    h, stream = pre_attention(delta, stream, w.norms, pos)
    attn_out, cache = mla_decode(h, w.mla, cache, mla)
    h, stream = pre_mlp(attn_out, stream, w.norms, pos)
    return latent_moe(h, w.moe, moe), stream, cache
