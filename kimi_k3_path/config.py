"""Kimi K3 model config, parsed from a Hugging Face `config.json`, and the per-rank shard shapes it implies.

A `config.json` of model_type `kimi_k3` nests the language model under `text_config` (model_type `kimi_linear`),
whose `linear_attn_config` says which layers are KDA and which are MLA. Only the fields the decode path reads are
modelled; each is required unless Hugging Face gives it a default, and the structural assumptions of the decode
path (SiTU experts, one-group sigmoid top-k routing, NoPE gated MLA, full-rank KDA gate...) are checked here, so a
different model fails at load time with the field named instead of computing something else.

Pure: pydantic and json only (no torch, no vllm).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

CONFIG_DIR = Path(__file__).parent / "configs"
MXFP4_BLOCK = 32  # OCP MX: one E8M0 scale per 32 elements along K


class ConfigError(ValueError):
    """A config.json the decode path cannot use. Names the file, the line where known, and every bad field."""

    def __init__(self, source: str, problems: list[tuple[str, str, int | None]]):
        self.source = source
        self.problems = problems  # (dotted field, reason, 1-based line or None)
        lines = [
            f"{source}:{line}: {field}: {reason}" if line else f"{source}: {field}: {reason}"
            for field, reason, line in problems
        ]
        super().__init__("\n".join(lines))


class _Section(BaseModel):
    # Real configs carry many fields the decode path does not read; only the modelled ones are checked.
    model_config = ConfigDict(extra="ignore", frozen=True)


class LinearAttnConfig(_Section):
    """`text_config.linear_attn_config`: the KDA layers (1-based layer numbers) and their dimensions."""

    kda_layers: tuple[int, ...]
    full_attn_layers: tuple[int, ...]
    num_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    short_conv_kernel_size: int = Field(ge=1)
    gate_lower_bound: float = Field(lt=0)
    use_full_rank_gate: Literal[True]


class TextConfig(_Section):
    """`text_config` (model_type kimi_linear): every field the decode layers read."""

    model_type: Literal["kimi_linear"]
    hidden_size: int = Field(ge=1)
    num_hidden_layers: int = Field(ge=1)
    rms_norm_eps: float = Field(gt=0)
    attn_res_block_size: int = Field(ge=1)
    # MLA (full-attention layers)
    num_attention_heads: int = Field(ge=1)
    q_lora_rank: int = Field(ge=1)
    kv_lora_rank: int = Field(ge=1)
    qk_nope_head_dim: int = Field(ge=1)
    qk_rope_head_dim: int = Field(ge=0)
    v_head_dim: int = Field(ge=1)
    mla_use_nope: Literal[True]  # the decode path applies no rotary embedding
    mla_use_output_gate: Literal[True]
    linear_attn_config: LinearAttnConfig
    # MLPs: a dense SiTU MLP in the first `first_k_dense_replace` layers, a latent MoE in every later one
    hidden_act: Literal["situ"]
    activation_situ_beta: float = Field(gt=0)
    activation_situ_linear_beta: float = Field(gt=0)
    intermediate_size: int = Field(ge=1)
    first_k_dense_replace: int = Field(ge=0)
    moe_layer_freq: Literal[1]
    num_experts: int = Field(ge=1)
    num_experts_per_token: int = Field(ge=1)
    num_shared_experts: int = Field(ge=0)
    moe_intermediate_size: int = Field(ge=1)
    routed_expert_hidden_size: int = Field(ge=1)
    latent_moe_use_norm: Literal[True]
    moe_router_activation_func: Literal["sigmoid"]
    moe_renormalize: Literal[True]
    routed_scaling_factor: float = Field(default=1.0, gt=0)
    num_expert_group: Literal[1]  # selection is one plain top-k over all experts
    topk_group: Literal[1]
    quantization_config: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _layers_are_consistent(self) -> TextConfig:
        kda, full = set(self.linear_attn_config.kda_layers), set(self.linear_attn_config.full_attn_layers)
        every = set(range(1, self.num_hidden_layers + 1))
        if kda & full:
            raise ValueError(f"linear_attn_config: layers {sorted(kda & full)} are both KDA and full attention")
        if kda | full != every:
            missing, extra = sorted(every - kda - full), sorted((kda | full) - every)
            raise ValueError(
                f"linear_attn_config: kda_layers and full_attn_layers must cover layers 1..{self.num_hidden_layers}"
                f" once each (missing {missing}, out of range {extra})"
            )
        if self.num_experts_per_token > self.num_experts:
            raise ValueError(
                f"num_experts_per_token={self.num_experts_per_token} exceeds num_experts={self.num_experts}"
            )
        if self.first_k_dense_replace > self.num_hidden_layers:
            raise ValueError("first_k_dense_replace exceeds num_hidden_layers")
        return self

    @property
    def expert_quant(self) -> str:
        """The routed experts' weight format: 'mxfp4' for the published checkpoint, 'bfloat16' if unquantized."""
        if self.quantization_config is None:
            return "bfloat16"
        fmt = str(self.quantization_config.get("format", ""))
        return "mxfp4" if "mxfp4" in fmt else fmt or str(self.quantization_config.get("quant_method", "unknown"))


class KimiK3Config(_Section):
    """The top-level `config.json` (model_type kimi_k3)."""

    model_type: Literal["kimi_k3"]
    text_config: TextConfig

    # --- the layer schedule (0-based layer indices, as in the model's module list) ---

    def attention_kind(self, layer: int) -> Literal["kda", "mla"]:
        self._check_layer(layer)
        return "kda" if layer + 1 in self.text_config.linear_attn_config.kda_layers else "mla"

    def mlp_kind(self, layer: int) -> Literal["dense", "moe"]:
        self._check_layer(layer)
        return "dense" if layer < self.text_config.first_k_dense_replace else "moe"

    def layer_kinds(self) -> tuple[str, ...]:
        """'kda_moe', 'mla_moe', 'kda_dense'... for every layer: the layer kinds the bench and executor name."""
        return tuple(
            f"{self.attention_kind(i)}_{self.mlp_kind(i)}" for i in range(self.text_config.num_hidden_layers)
        )

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.text_config.num_hidden_layers:
            raise IndexError(f"layer {layer} is outside 0..{self.text_config.num_hidden_layers - 1}")

    def shard_shapes(self, tp: int) -> ShardShapes:
        return shard_shapes(self, tp)


# --------------------------------------------------------------------------------------------------------------
# Loading


def _line_of(text: str, loc: tuple[str | int, ...]) -> int | None:
    """The line of the deepest key of `loc` found in the JSON text, searching each key after its parent's.
    Good enough to point an operator at the right spot; None when even the first key is absent."""
    position, found = 0, None
    for key in loc:
        if isinstance(key, int):
            break
        at = text.find(f'"{key}"', position)
        if at < 0:
            break
        position, found = at, at
    return None if found is None else text.count("\n", 0, found) + 1


def parse_config(data: Any, source: str = "<config>", text: str | None = None) -> KimiK3Config:
    """Validate a decoded config.json; raise ConfigError naming every bad field (and its line, given `text`)."""
    if not isinstance(data, dict):
        raise ConfigError(source, [("<top level>", f"expected a JSON object, got {type(data).__name__}", None)])
    try:
        return KimiK3Config.model_validate(data)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            loc = tuple(item["loc"])
            field = ".".join(str(part) for part in loc) or "<top level>"
            reason = item["msg"].removeprefix("Value error, ")
            if item["type"] == "literal_error" and "input" in item:
                reason += f", got {item['input']!r}"
            problems.append((field, reason, _line_of(text, loc) if text is not None else None))
        raise ConfigError(source, problems) from None


def load_config(path: str | Path) -> KimiK3Config:
    """Read and validate a config.json file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(str(path), [("<file>", f"cannot read: {error.strerror or error}", None)]) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(str(path), [("<json>", error.msg, error.lineno)]) from None
    return parse_config(data, str(path), text)


def named_config(name: Literal["kimi_k3", "tiny"]) -> KimiK3Config:
    """A shipped fixture: 'kimi_k3' (the real dimensions) or 'tiny' (same structure, small, for CPU tests)."""
    path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        shipped = sorted(p.stem for p in CONFIG_DIR.glob("*.json"))
        raise ValueError(f"no shipped config {name!r}; shipped: {', '.join(shipped)}")
    return load_config(path)


# --------------------------------------------------------------------------------------------------------------
# Per-rank shard shapes


@dataclass(frozen=True)
class Projection:
    """One projection's weight on one tensor-parallel rank: y[M, n] = x[M, k] @ W[n, k]^T.

    `split` is how the full weight is divided across ranks: 'column' (over n), 'row' (over k, output all-reduced),
    or 'replicated' (every rank holds it whole)."""

    n: int
    k: int
    split: Literal["column", "row", "replicated"]


@dataclass(frozen=True)
class ShardShapes:
    """Per-rank dimensions at tensor-parallel size `tp`, as vLLM shards Kimi K3 (experts: TP, not EP)."""

    tp: int
    kda_heads: int
    mla_heads: int
    expert_intermediate: int  # routed expert intermediate per rank, unpadded (what the kernels use)
    expert_intermediate_stock: int  # the same as stock vLLM allocates it: padded up to 256 per rank
    shared_intermediate: int  # both shared experts fused, per rank
    dense_intermediate: int  # the dense MLP of the first layer(s), per rank
    projections: dict[str, Projection]  # per-expert shapes for moe.expert_w13 / moe.expert_w2


# Stock vLLM pads each rank's expert intermediate to at least this (its MoE kernels' tile), e.g. 192 -> 256 at TP16.
STOCK_MIN_EXPERT_INTERMEDIATE_PER_RANK = 256


def _divide(total: int, tp: int, what: str) -> int:
    if total % tp:
        raise ValueError(f"{what}={total} is not divisible by tp={tp}")
    return total // tp


def shard_shapes(config: KimiK3Config, tp: int) -> ShardShapes:
    """Heads per rank, (N, K) of every projection and the expert intermediate per rank at tensor-parallel `tp`.

    Raises ValueError when a dimension does not divide, or when an MXFP4 expert shard would split a 32-block."""
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    t = config.text_config
    lin = t.linear_attn_config
    hidden, latent = t.hidden_size, t.routed_expert_hidden_size

    kda_heads = _divide(lin.num_heads, tp, "linear_attn_config.num_heads")
    kda_width = kda_heads * lin.head_dim
    mla_heads = _divide(t.num_attention_heads, tp, "num_attention_heads")
    expert_i = _divide(t.moe_intermediate_size, tp, "moe_intermediate_size")
    if t.expert_quant == "mxfp4" and expert_i % MXFP4_BLOCK:
        raise ValueError(
            f"moe_intermediate_size/tp={expert_i} is not a multiple of the MXFP4 block {MXFP4_BLOCK} (tp={tp})"
        )
    shared_i = _divide(t.moe_intermediate_size * t.num_shared_experts, tp, "moe_intermediate_size*num_shared_experts")
    dense_i = _divide(t.intermediate_size, tp, "intermediate_size")

    def col(n: int, k: int) -> Projection:
        return Projection(n, k, "column")

    projections = {
        # KDA: q, k, v and the full-rank output gate g are column-split by head; f_a (the low-rank forget-gate
        # input) is replicated and f_b expands it per head; b is one beta per head.
        "kda.q_proj": col(kda_width, hidden),
        "kda.k_proj": col(kda_width, hidden),
        "kda.v_proj": col(kda_width, hidden),
        "kda.g_proj": col(kda_width, hidden),
        "kda.f_a_proj": Projection(lin.head_dim, hidden, "replicated"),
        "kda.f_b_proj": col(kda_width, lin.head_dim),
        "kda.b_proj": col(kda_heads, hidden),
        "kda.o_proj": Projection(hidden, kda_width, "row"),
        # MLA (weight absorption): the low-rank q and kv inputs are replicated; q_b / kv_b / g / o by head.
        "mla.q_a_proj": Projection(t.q_lora_rank, hidden, "replicated"),
        "mla.kv_a_proj": Projection(t.kv_lora_rank + t.qk_rope_head_dim, hidden, "replicated"),
        "mla.g_proj": col(mla_heads * t.v_head_dim, hidden),
        "mla.q_b_proj": col(mla_heads * (t.qk_nope_head_dim + t.qk_rope_head_dim), t.q_lora_rank),
        "mla.kv_b_proj": col(mla_heads * (t.qk_nope_head_dim + t.v_head_dim), t.kv_lora_rank),
        "mla.o_proj": Projection(hidden, mla_heads * t.v_head_dim, "row"),
        # Dense SiTU MLP (gate rows then up rows)
        "dense.gate_up_proj": col(2 * dense_i, hidden),
        "dense.down_proj": Projection(hidden, dense_i, "row"),
        # Latent MoE: router, down to the latent space and back up are replicated in stock vLLM; each expert's
        # intermediate is column-split (w13) / row-split (w2); the shared experts work on the hidden state.
        "moe.gate": Projection(t.num_experts, hidden, "replicated"),
        "moe.down_proj": Projection(latent, hidden, "replicated"),
        "moe.expert_w13": col(2 * expert_i, latent),
        "moe.expert_w2": Projection(latent, expert_i, "row"),
        "moe.up_proj": Projection(hidden, latent, "replicated"),
        "moe.shared_gate_up_proj": col(2 * shared_i, hidden),
        "moe.shared_down_proj": Projection(hidden, shared_i, "row"),
    }
    return ShardShapes(
        tp=tp,
        kda_heads=kda_heads,
        mla_heads=mla_heads,
        expert_intermediate=expert_i,
        expert_intermediate_stock=expert_i if tp == 1 else max(expert_i, STOCK_MIN_EXPERT_INTERMEDIATE_PER_RANK),
        shared_intermediate=shared_i,
        dense_intermediate=dense_i,
        projections=projections,
    )
