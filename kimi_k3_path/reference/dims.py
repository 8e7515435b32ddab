"""Per-rank reference dims of one decode layer, from a parsed Kimi K3 config and a TP size."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import KimiK3Config, shard_shapes
from .kda import KdaDims
from .mla import MlaDims
from .moe import MoeDims


@dataclass(frozen=True)
class LayerDims:
    tp: int
    kda: KdaDims
    mla: MlaDims
    moe: MoeDims
    attn_res_block: int
    num_layers: int
    stock_intermediate: int  # the expert intermediate per rank as stock vLLM allocates it (zero-padded)

    @property
    def max_blocks(self) -> int:
        """Completed-block snapshots the residual stream holds (vLLM's num_attn_res_blocks)."""
        return -(-self.num_layers // self.attn_res_block)


def layer_dims(config: KimiK3Config, tp: int) -> LayerDims:
    """The unpadded per-rank shapes (what the specialized kernels use); raises ValueError if `tp` does not divide."""
    t = config.text_config
    lin = t.linear_attn_config
    shards = shard_shapes(config, tp)
    eps = t.rms_norm_eps
    return LayerDims(
        tp=tp,
        kda=KdaDims(
            hidden=t.hidden_size, heads=shards.kda_heads, head_dim=lin.head_dim,
            conv_width=lin.short_conv_kernel_size, gate_lower_bound=lin.gate_lower_bound,
        ),
        mla=MlaDims(
            hidden=t.hidden_size, heads=shards.mla_heads, q_lora=t.q_lora_rank, kv_lora=t.kv_lora_rank,
            qk_nope=t.qk_nope_head_dim, qk_rope=t.qk_rope_head_dim, v_head=t.v_head_dim, eps=eps,
        ),
        moe=MoeDims(
            hidden=t.hidden_size, latent=t.routed_expert_hidden_size, experts=t.num_experts,
            top_k=t.num_experts_per_token, intermediate=shards.expert_intermediate,
            shared_intermediate=shards.shared_intermediate, routed_scaling_factor=t.routed_scaling_factor, eps=eps,
        ),
        attn_res_block=t.attn_res_block_size,
        num_layers=t.num_hidden_layers,
        stock_intermediate=shards.expert_intermediate_stock,
    )
